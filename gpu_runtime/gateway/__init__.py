"""The inference gateway: an ASGI app (served by uvicorn on 127.0.0.1) in front of Triton. See app.py."""
