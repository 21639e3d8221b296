"""ModelRunner's in-place KV cache: decode steps write into spare columns, and the logits stay
those of a full forward pass of the same tokens."""

import pytest

torch = pytest.importorskip("torch")

from areal.server.engine import SPARE_COLUMNS, ModelRunner  # noqa: E402


def test_decode_in_place_matches_full_forward_across_reallocations(varied_model_dir, ref_model):
    runner = ModelRunner(varied_model_dir, dtype="float32", device="cpu")
    prompts = [[3, 9, 4, 7, 1], [5, 2]]  # different lengths: the second row is left-padded
    batch, logits = runner.prefill(prompts)
    seqs = [list(p) for p in prompts]
    buffers = set()
    steps = SPARE_COLUMNS + 6  # crosses one reallocation
    for _ in range(steps):
        tokens = logits.argmax(-1).tolist()
        for seq, tok in zip(seqs, tokens):
            seq.append(tok)
        logits = runner.decode(batch, tokens)
        buffers.add(batch.layers[0][0].untyped_storage().data_ptr())
    # one buffer per reallocation, not one per step
    assert len(buffers) == 2
    assert batch.mask.shape[1] == len(prompts[0]) + steps
    for row, seq in enumerate(seqs):
        with torch.no_grad():
            ref = ref_model(torch.tensor([seq])).logits[0, -1]
        torch.testing.assert_close(logits[row], ref, atol=1e-4, rtol=1e-4)


def test_rows_selected_or_merged_keep_decoding_correctly(varied_model_dir, ref_model):
    from areal.server.engine import KVBatch

    runner = ModelRunner(varied_model_dir, dtype="float32", device="cpu")
    a, la = runner.prefill([[3, 9, 4], [8, 8, 1, 2]])
    seqs = [[3, 9, 4], [8, 8, 1, 2]]
    for _ in range(3):
        toks = la.argmax(-1).tolist()
        for s, t in zip(seqs, toks):
            s.append(t)
        la = runner.decode(a, toks)
    pending = la.argmax(-1).tolist()
    b, lb = runner.prefill([[6, 1]])
    merged = KVBatch.merge(a.select([1]), b)  # drop row 0, add a new sequence
    live = [seqs[1] + [pending[1]], [6, 1, int(lb.argmax(-1))]]
    logits = runner.decode(merged, [live[0][-1], live[1][-1]])
    for row, seq in enumerate(live):
        with torch.no_grad():
            ref = ref_model(torch.tensor([seq])).logits[0, -1]
        torch.testing.assert_close(logits[row], ref, atol=1e-4, rtol=1e-4)
