"""Client side of SGLang-compatible inference servers: protocol (pure payloads), http (transport),
discovery (server addresses), client (RemoteSGLangEngine), pretrained / local_servers
(RemoteSGLangEngine.from_pretrained). Modules are imported where used; this file stays light."""
