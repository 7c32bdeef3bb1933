"""Runs read together: the jobs of a sweep found with their overrides and status (runs.py), folded into one row
per configuration with replicates as mean +- sd and n, against a baseline (fold.py), as text, CSV and JSON
(tables.py) and as an HTML page with the learning curves overlaid (html.py). `python -m minirl.report DIR`."""
