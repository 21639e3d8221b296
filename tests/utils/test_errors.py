"""describe_failure names the root of a failure: an agent whose connection the peer reset sees the
reset and the address on the one line of its error, not only openai's 'Connection error.'."""

import asyncio
import socket
import struct
import threading

from areal.utils.errors import describe_failure
from areal.workflow.agent import openai_client


def resetting_server() -> tuple[socket.socket, threading.Thread]:
    """Accepts one connection, reads the request, and resets it (SO_LINGER 0)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve():
        conn, _ = server.accept()
        conn.recv(65536)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_a_reset_agent_call_names_the_reset_and_the_address():
    server, thread = resetting_server()
    port = server.getsockname()[1]

    async def call():
        client = openai_client(f"http://127.0.0.1:{port}/v1", timeout_s=30, concurrency=4)
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        finally:
            await client.close()

    try:
        asyncio.run(call())
    except Exception as exc:  # openai.APIConnectionError
        text = describe_failure(exc)
    else:
        raise AssertionError("the call to a resetting server succeeded")
    finally:
        thread.join(10)
        server.close()
    assert text.startswith("APIConnectionError: Connection error.")
    assert "root cause: ConnectionResetError" in text and "Connection reset by peer" in text
    assert f"at POST http://127.0.0.1:{port}/v1/chat/completions" in text


def test_a_plain_error_is_left_as_it_is():
    assert describe_failure(ValueError("bad")) == "ValueError: bad"
