"""FSDP2 training engine: see engine.py."""
