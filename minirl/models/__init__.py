"""Loading a policy by hub id or path (never training it), and the embedded tiny architecture."""
