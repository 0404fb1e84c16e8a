"""distseq's MS-TCN and local-attention transformer heads: exact gradients behind the chunked CNN,
causality, receptive fields, padding, and the attention checked against dense attention."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import random_batch, tiny_model
from distseq.config import HeadConfig, LossConfig, load_config
from distseq.errors import ConfigError
from distseq.model.head import build_head, head_logits, last_stage
from distseq.model.transformer import LocalAttention, alibi_slopes
from distseq.train.loss import Loss

HEADS = {
    "mstcn": {"kind": "mstcn", "stages": 2, "layers": 3},
    "mstcn_causal": {"kind": "mstcn", "stages": 2, "layers": 3, "causal": True},
    "transformer": {"kind": "transformer", "layers": 2, "span": 3, "attention_heads": 2},
    "transformer_causal": {
        "kind": "transformer",
        "layers": 2,
        "span": 3,
        "attention_heads": 2,
        "causal": True,
    },
}
CAUSAL = [name for name in HEADS if name.endswith("causal")]


def head(name: str, in_dim: int = 6, classes: int = 3, **extra: object) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = HeadConfig(**{"hidden": 8, **HEADS[name], **extra})  # type: ignore[arg-type]
    return build_head(in_dim, cfg, classes).eval()


@torch.no_grad()
def logits(module: torch.nn.Module, feats: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return last_stage(head_logits(module, False, feats, mask, None))


@pytest.mark.parametrize("name", list(HEADS))
@pytest.mark.parametrize("recompute", ["torch", "fairscale"])
def test_every_head_gets_the_plain_gradients_behind_the_chunked_cnn(
    name: str, recompute: str
) -> None:
    # Weighted cross-entropy and the smoothing term over every stage, as training runs them.
    batch = random_batch(2, 13, lengths=[13, 9])
    loss = Loss(LossConfig(smoothing=0.15), [1.0, 2.0, 0.5])
    counts = torch.stack([loss.counts(batch.labels, batch.mask)])[0]

    def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
        ce, smooth = loss.sums(model(batch.frames, batch.mask), batch.labels, batch.mask)
        loss.total(ce, smooth, counts).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref = grads(tiny_model("none", chunk=1000, **HEADS[name]))
    got = grads(tiny_model(recompute, chunk=4, **HEADS[name]))
    assert got.keys() == ref.keys() and len(ref) > 20
    for n in ref:
        err = (got[n] - ref[n]).abs().max() / ref[n].abs().max().clamp_min(1e-12)
        assert err < 1e-5, (n, float(err))


@pytest.mark.parametrize("name", list(HEADS))
def test_changing_frame_t_changes_no_output_before_t_in_a_causal_head(name: str) -> None:
    module = head(name)
    feats, mask = torch.randn(1, 12, 6), torch.ones(1, 12, dtype=torch.bool)
    changed = feats.clone()
    changed[0, 7] += 1.0
    before = (logits(module, changed, mask) - logits(module, feats, mask)).abs().amax(-1)[0]
    assert before[7:].max() > 1e-3  # the change is seen
    seen_earlier = float(before[:7].max())
    if name in CAUSAL:
        assert seen_earlier == 0.0
    else:
        assert seen_earlier > 1e-4  # the offline heads see the future: the check can fail


@pytest.mark.parametrize("causal", [False, True])
def test_mstcn_stage_sees_exactly_its_receptive_field(causal: bool) -> None:
    # One stage of 3 layers, dilations 1, 2, 4, kernel 3: 1 + 2 (1 + 2 + 4) = 15 frames, centred
    # or, causal, the frame and the 14 before it.
    module = head("mstcn", stages=1, layers=3, causal=causal)
    feats, mask = torch.randn(1, 40, 6), torch.ones(1, 40, dtype=torch.bool)
    changed = feats.clone()
    changed[0, 20] += 1.0
    moved = (logits(module, changed, mask) - logits(module, feats, mask)).abs().amax(-1)[0]
    seen = torch.nonzero(moved > 0)[:, 0]
    assert (int(seen.min()), int(seen.max())) == ((20, 34) if causal else (13, 27))


@pytest.mark.parametrize("name", list(HEADS))
def test_a_video_gives_the_same_outputs_padded_in_a_batch_as_alone(name: str) -> None:
    module = head(name)
    feats = torch.randn(2, 11, 6)
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, 7:] = False
    feats[1, 7:] = 0  # as the backbone leaves padding
    batched = logits(module, feats, mask)[1, :7]
    alone = logits(module, feats[1:, :7], mask[1:, :7])[0]
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)


def test_mstcn_returns_every_stage_and_feeds_each_the_softmax_of_the_last() -> None:
    module = head("mstcn", stages=3)
    feats, mask = torch.randn(2, 9, 6), torch.ones(2, 9, dtype=torch.bool)
    out = head_logits(module, False, feats, mask, None)
    assert out.shape == (3, 2, 9, 3)
    # Stage 2 over stage 1's softmax gives stage 2's logits.
    stage2 = module.stages[1](out[0].softmax(-1).transpose(1, 2), mask[:, None].float())
    torch.testing.assert_close(stage2.transpose(1, 2), out[1])


@pytest.mark.parametrize("causal", [False, True])
def test_local_attention_is_dense_attention_restricted_to_the_window(causal: bool) -> None:
    torch.manual_seed(0)
    t, w, width, heads = 11, 3, 8, 2
    attention = LocalAttention(width, heads, w, causal)
    x = torch.randn(2, t, width)
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[1, 8:] = False
    got = attention(x, mask)
    # Dense reference: every query against every key, allowed where |i - j| < w (j <= i when
    # causal) and the key is real.
    q, k, v = (p.unflatten(-1, (heads, -1)).transpose(1, 2) for p in attention.qkv(x).chunk(3, -1))
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    near = ((i - j) >= 0) & ((i - j) < w) if causal else (i - j).abs() < w
    allowed = near & mask[:, None, None, :]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(width // heads)
    scores = scores - alibi_slopes(heads)[:, None, None] * (i - j).abs()  # ALiBi's distance bias
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    ref = attention.proj((weights @ v).transpose(1, 2).flatten(2))
    torch.testing.assert_close(got[0], ref[0])
    torch.testing.assert_close(got[1, :8], ref[1, :8])  # the padded frames' rows are not used


@pytest.mark.parametrize("name", ["transformer", "transformer_causal", "mstcn"])
def test_a_window_cut_anywhere_gives_its_inner_frames_the_whole_videos_outputs(name: str) -> None:
    # What a frame sees depends on distances, never on where a training window began: frames
    # whose reach lies inside the window get the whole video's outputs. The transformer's 2
    # blocks reach 2 x (3 - 1) = 4 frames each way; MS-TCN's 3 layers 7 (one stage: the second
    # sees the first's reach again), so 14.
    module = head(name)
    reach = 14 if name == "mstcn" else 4
    feats, mask = torch.randn(1, 80, 6), torch.ones(1, 80, dtype=torch.bool)
    whole = logits(module, feats, mask)[0]
    cut = logits(module, feats[:, 20:60], mask[:, 20:60])[0]
    inner = slice(reach, 40 - reach)
    torch.testing.assert_close(cut[inner], whole[20:60][inner], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "overrides,key",
    [
        (["model.head.kind=mstcn", "model.head.stages=0"], "model.head.stages"),
        (["model.head.kind=transformer", "model.head.span=0"], "model.head.span"),
        (["model.head.kind=transformer", "model.head.attention_heads=3"], "attention_heads"),
        (["model.head.kind=mstcn", "model.head.bidirectional=true"], "model.head.bidirectional"),
        (["model.head.kind=gru", "model.head.causal=true"], "model.head.causal"),
        (["model.head.kind=mstcn", "memory.tbptt_frames=8"], "memory.tbptt_frames"),
        (["model.head.kind=lstm", "model.head.stages=2"], "model.head.stages=2 \\(mstcn\\)"),
        (["model.head.kind=mstcn", "model.head.span=64"], "model.head.span=64 \\(transf"),
        (["model.head.kind=none", "model.head.causal=true"], "model.head.causal"),
        (["model.head.kind=transformer", "data.ordered=true"], "data.ordered"),
        (["model.head.kind=tcn"], "model.head.kind"),
    ],
)
def test_a_head_option_out_of_range_is_one_line_naming_it(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key) as e:
        load_config(None, ["data.train=s/x.tar", *overrides])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", ["mstcn", "transformer", "usernets:make_head"])
def test_a_switch_from_an_rnn_names_every_key_left_for_it_in_one_line(kind: str) -> None:
    """The RNN config's own keys, left behind when its head is switched: one run names them all
    (it took one run a key)."""
    rnn = [
        "model.head.chrono_frames=300",
        "memory.tbptt_frames=64",
        "model.head.bidirectional=false",
    ]
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.train=s/x.tar", *rnn, f"model.head.kind={kind}"])
    assert str(e.value) == (
        f"config key model.head.kind={kind!r}: these keys are for another head, unset them: "
        "model.head.chrono_frames=300 (lstm or gru), memory.tbptt_frames=64 (lstm or gru)"
    )
