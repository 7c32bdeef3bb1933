"""An OpenAI-compatible chat-completions server (`python -m minirl.serve`).

decoder.py        batched KV-cache decoding with per-row sampling, seeds, stop strings
scheduler.py      the worker thread that owns the model; the bounded request queue; batching
turn_splitter.py  generated text -> content, reasoning and tool calls, as it streams
openai_api.py     request models, template messages, response/chunk/error objects
app.py            the FastAPI routes and error handling
auth.py           the API key: serve.api_key or $MINIRL_API_KEY, the loopback rule, the bearer check
server.py         model loading and uvicorn
launch.py         start the server as a child process and wait until it serves (tests, benchmarks)
"""
