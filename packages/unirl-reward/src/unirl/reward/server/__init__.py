"""The reward HTTP server (FastAPI + uvicorn): `unirl-reward serve --config scorers.yaml`."""
