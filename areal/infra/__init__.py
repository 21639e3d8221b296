"""Torch-free helpers that the launcher and the library share: host facts (host.py), free ports
(ports.py), the inference-server command line (servers.py), where servers are (discovery.py) and
whether they answer (health.py), the processes' log line format (log_format.py) and the model
names only this project loads (model_names.py). Nothing here imports torch, transformers or
sglang."""
