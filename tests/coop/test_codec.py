"""coop.codec: round trips, stated error bounds, exact byte counts, error feedback, hostile input."""

import math

import numpy as np
import pytest

from coop.codec import (
    CODECS,
    BF16Codec,
    Int4Codec,
    Int8Codec,
    TopKCodec,
    TopKInt8Codec,
    bf16_bits_to_float32,
    decode,
    float32_to_bf16_bits,
    get_codec,
)
from coop.wire import WireError, pack, unpack

SHAPES = {"wte.weight": (37, 16), "h.0.attn.c_attn.bias": (48,), "ln_f.weight": (16,), "scalar": (), "odd": (3, 5, 7)}


def sample_update(seed: int = 0, scale: float = 1e-2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * scale).astype(np.float32) for name, shape in SHAPES.items()}


ALL_CODECS = [
    ("fp32", {}),
    ("fp16", {}),
    ("bf16", {}),
    ("int8", {}),
    ("int8", {"block_size": 7}),
    ("topk", {"ratio": 0.1}),
    ("topk", {"ratio": 1.0}),
    ("int4", {}),
    ("int4", {"block_size": 5}),
    ("topk8", {"ratio": 0.1}),
    ("topk8", {"ratio": 1.0, "block_size": 3}),
]


@pytest.mark.parametrize("name, options", ALL_CODECS)
def test_round_trip_through_the_wire_keeps_names_shapes_and_byte_count(name, options):
    codec = get_codec(name, **options)
    update = sample_update()
    encoded = codec.encode(update)
    assert encoded.nbytes == codec.payload_nbytes(SHAPES)  # the exact byte count
    tensors, metadata = unpack(pack(encoded.tensors, encoded.metadata))
    assert metadata["codec"] == name
    decoded = decode(tensors, metadata, expected_shapes=SHAPES)
    assert set(decoded) == set(update)
    for key, x in update.items():
        assert decoded[key].dtype == np.float32 and decoded[key].shape == x.shape


def test_payload_bytes_formulas():
    n = 1000
    shapes = {"w": (n,)}
    assert get_codec("fp32").payload_nbytes(shapes) == 4 * n
    assert get_codec("fp16").payload_nbytes(shapes) == 2 * n
    assert get_codec("bf16").payload_nbytes(shapes) == 2 * n
    assert get_codec("int8", block_size=256).payload_nbytes(shapes) == n + 4 * 4  # ceil(1000/256) = 4 scales
    assert get_codec("topk", ratio=0.01).payload_nbytes(shapes) == 8 * 10
    assert get_codec("int4", block_size=64).payload_nbytes(shapes) == 500 + 4 * 16  # ceil(1000/64) = 16 scales
    assert get_codec("int4", block_size=64).payload_nbytes({"w": (7,)}) == 4 + 4  # an odd count pads a nibble
    assert get_codec("topk8", ratio=0.1, block_size=64).payload_nbytes(shapes) == 5 * 100 + 4 * 2


def test_fp32_is_lossless():
    update = sample_update()
    codec = get_codec("fp32")
    decoded = codec.decode(*vars(codec.encode(update)).values())
    for key in update:
        np.testing.assert_array_equal(decoded[key], update[key])


def test_fp16_error_bound():
    rng = np.random.default_rng(1)
    # normal range and subnormal range of fp16
    x = np.concatenate([rng.uniform(-60000, 60000, 5000), rng.standard_normal(5000) * 1e-6]).astype(np.float32)
    codec = get_codec("fp16")
    y = codec.decode(*vars(codec.encode({"x": x})).values())["x"]
    err = np.abs(y.astype(np.float64) - x)
    bound = np.maximum(2.0**-11 * np.abs(x.astype(np.float64)), 2.0**-25)
    assert (err <= bound).all()


def test_fp16_refuses_values_beyond_its_range():
    with pytest.raises(ValueError, match="bf16 or fp32"):
        get_codec("fp16").encode({"x": np.array([7e4], np.float32)})


def test_bf16_error_bound_and_exact_round_trip_of_bf16_values():
    rng = np.random.default_rng(2)
    x = np.concatenate(
        [rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000), rng.standard_normal(100) * 1e-39]
    ).astype(np.float32)
    codec = BF16Codec()
    y = codec.decode(*vars(codec.encode({"x": x})).values())["x"]
    err = np.abs(y.astype(np.float64) - x)
    bound = np.maximum(2.0**-8 * np.abs(x.astype(np.float64)), 2.0**-134)
    assert (err <= bound).all()
    # values already representable in bf16 come back bit for bit
    np.testing.assert_array_equal(bf16_bits_to_float32(float32_to_bf16_bits(y)), y)


def test_bf16_rounds_to_nearest_even():
    def bits(pattern: int) -> np.ndarray:
        return np.array([pattern], dtype=np.uint32).view(np.float32)

    assert float32_to_bf16_bits(bits(0x3F808000))[0] == 0x3F80  # tie, kept bit even: down
    assert float32_to_bf16_bits(bits(0x3F818000))[0] == 0x3F82  # tie, kept bit odd: up to even
    assert float32_to_bf16_bits(bits(0x3F808001))[0] == 0x3F81  # above the tie: up
    assert float32_to_bf16_bits(bits(0x3F807FFF))[0] == 0x3F80  # below the tie: down
    assert float32_to_bf16_bits(bits(0xBF818000))[0] == 0xBF82  # negative, same rule on magnitude
    assert float32_to_bf16_bits(bits(0x00000001))[0] == 0x0000  # tiniest subnormal rounds to zero


def test_bf16_matches_torch_where_available():
    torch = pytest.importorskip("torch")
    x = (np.random.default_rng(3).standard_normal(10000) * 100).astype(np.float32)
    reference = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(float32_to_bf16_bits(x), reference)


def test_bf16_refuses_overflow():
    with pytest.raises(ValueError, match="overflow"):
        BF16Codec().encode({"x": np.array([np.finfo(np.float32).max], np.float32)})


@pytest.mark.parametrize("block_size", [1, 7, 64, 256, 4096])
def test_int8_error_bound_per_block(block_size):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(3001) * np.repeat(10.0 ** rng.integers(-4, 2, 31), 100)[:3001]).astype(np.float32)
    zero_block = block_size < 1000
    if zero_block:
        x[:block_size] = 0.0  # an all-zero block decodes to exact zeros
    codec = Int8Codec(block_size=block_size)
    encoded = codec.encode({"x": x})
    assert encoded.tensors["x.q"].dtype == np.int8 and encoded.tensors["x.q"].shape == (3001,)
    assert encoded.tensors["x.scale"].shape == (math.ceil(3001 / block_size),)
    assert encoded.nbytes == 3001 + 4 * math.ceil(3001 / block_size)
    y = codec.decode(encoded.tensors, encoded.metadata)["x"]
    absmax = np.array([np.abs(x[i : i + block_size]).max() for i in range(0, x.size, block_size)], dtype=np.float64)
    bound = np.repeat(absmax / 254, block_size)[: x.size] * (1 + 1e-5)  # float32 rounding slack
    assert (np.abs(y.astype(np.float64) - x) <= bound).all()
    if zero_block:
        np.testing.assert_array_equal(y[:block_size], 0.0)
    # each block's absmax element is reproduced almost exactly (its code is +-127)
    assert np.abs(encoded.tensors["x.q"]).max() == 127


def test_topk_keeps_the_largest_entries_with_sorted_indices():
    x = np.array([0.1, -5.0, 0.2, 3.0, -0.05, 4.0, 0.0, -0.3, 0.01, 0.02], np.float32)
    codec = TopKCodec(ratio=0.3, error_feedback=False)
    encoded = codec.encode({"x": x})
    np.testing.assert_array_equal(encoded.tensors["x.idx"], np.array([1, 3, 5], np.uint32))
    np.testing.assert_array_equal(encoded.tensors["x.val"], np.array([-5.0, 3.0, 4.0], np.float32))
    assert encoded.nbytes == 3 * 8
    y = codec.decode(encoded.tensors, encoded.metadata)["x"]
    np.testing.assert_array_equal(y, np.where(np.isin(np.arange(10), [1, 3, 5]), x, 0))


def test_topk_error_bound_of_one_round():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(1000).astype(np.float32)
    for ratio in (0.01, 0.1, 0.5):
        codec = TopKCodec(ratio=ratio, error_feedback=False)
        y = codec.decode(*vars(codec.encode({"x": x})).values())["x"]
        k = codec.k_of(x.size)
        assert np.linalg.norm(x - y) <= math.sqrt(1 - k / x.size) * np.linalg.norm(x) + 1e-6


def test_topk_error_feedback_loses_nothing_only_delays_it():
    codec = TopKCodec(ratio=0.05)
    rounds = [sample_update(seed) for seed in range(20)]
    sent = {name: np.zeros(shape, np.float64) for name, shape in SHAPES.items()}
    for update in rounds:
        encoded = codec.encode(update)
        for name, y in codec.decode(encoded.tensors, encoded.metadata, SHAPES).items():
            sent[name] += y
    for name, shape in SHAPES.items():
        total = sum(update[name].astype(np.float64) for update in rounds)
        residual = codec.residual[name].reshape(shape)
        np.testing.assert_allclose(sent[name] + residual, total, rtol=0, atol=1e-6)
    # the residual is what error feedback adds next round: without it, an entry that is never
    # large enough would never be sent
    small = {"x": np.full(10, 0.01, np.float32)}
    small["x"][0] = 1.0
    codec = TopKCodec(ratio=0.1)  # k = 1: only the big entry would ever be sent without feedback
    seen = np.zeros(10)
    for _ in range(300):
        encoded = codec.encode(small)
        seen += codec.decode(encoded.tensors, encoded.metadata)["x"] != 0
    assert (seen > 0).all()


def test_topk_reset_and_shape_change():
    codec = TopKCodec(ratio=0.5)
    codec.encode({"x": np.ones(4, np.float32)})
    with pytest.raises(ValueError, match="reset"):
        codec.encode({"x": np.ones(5, np.float32)})
    codec.reset()
    codec.encode({"x": np.ones(5, np.float32)})


@pytest.mark.parametrize("name", sorted(CODECS))
def test_encode_refuses_non_finite_updates(name):
    x = np.array([1.0, np.nan], np.float32)
    with pytest.raises(ValueError, match="NaN"):
        get_codec(name).encode({"x": x})


def test_unknown_codec_and_bad_options():
    with pytest.raises(ValueError, match="choose one of"):
        get_codec("zip")
    with pytest.raises(ValueError, match="bad options"):
        get_codec("fp16", block_size=3)
    with pytest.raises(ValueError, match="block_size"):
        get_codec("int8", block_size=0)
    with pytest.raises(ValueError, match="ratio"):
        get_codec("topk", ratio=0.0)


# -- hostile input: everything must be a WireError, nothing allocated from claimed shapes -------


def encoded_message(name: str, **options):
    encoded = get_codec(name, **options).encode({"w": np.arange(10, dtype=np.float32) - 4.5})
    return dict(encoded.tensors), dict(encoded.metadata)


def test_decode_refuses_shapes_other_than_the_model_s():
    tensors, metadata = encoded_message("topk", ratio=0.2)
    metadata["shapes"] = {"w": [10**12]}
    with pytest.raises(WireError, match="do not match the model"):
        decode(tensors, metadata, expected_shapes={"w": (10,)})


@pytest.mark.parametrize(
    "codec, mutate, message",
    [
        ("fp32", lambda t, m: m.update(codec="gzip"), "codec"),
        ("fp32", lambda t, m: m.update(options=[1]), "options"),
        ("fp32", lambda t, m: m.update(shapes={"w": [-10]}), "shapes"),
        ("fp32", lambda t, m: t.update(w=t["w"].astype(np.float64)), "expected float32"),
        ("fp32", lambda t, m: t.update(extra=np.zeros(1, np.float32)), "unexpected"),
        ("fp16", lambda t, m: t.update(w=t["w"][:5]), "shape"),
        ("int8", lambda t, m: m.update(options={"block_size": 0}), "block_size"),
        ("int8", lambda t, m: m.update(options={"block_size": 4, "evil": 1}), "bad options"),
        ("int8", lambda t, m: t.update({"w.scale": np.zeros(7, np.float32)}), "w.scale"),
        ("int8", lambda t, m: t["w.scale"].__setitem__(0, np.inf), "finite"),
        ("int8", lambda t, m: t.pop("w.q"), "missing"),
        ("topk", lambda t, m: t["w.idx"].__setitem__(0, 10), "indices"),
        ("topk", lambda t, m: t.update({"w.idx": np.arange(3, dtype=np.uint32)}), r"w.val': expected float32 array of shape \(3,\)"),
        ("topk", lambda t, m: t.update({"w.idx": np.array([3, 3], np.uint32)}), "strictly increasing"),
        ("topk", lambda t, m: t.update({"w.idx": np.zeros(2, np.int64)}), "uint32"),
    ],
)
def test_decode_refuses_malformed_encodings(codec, mutate, message):
    tensors, metadata = encoded_message(codec)
    if codec == "topk":
        tensors, metadata = encoded_message(codec, ratio=0.2)
    mutate(tensors, metadata)
    with pytest.raises(WireError, match=message):
        decode(tensors, metadata, expected_shapes={"w": (10,)})


# -- int4 and topk8: block-scaled low-bit codes with error feedback ---------------------------


def test_int4_error_bound_per_block_without_feedback():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(1000) * np.repeat(rng.uniform(0.01, 10, 16), 63)[:1000]).astype(np.float32)
    codec = Int4Codec(block_size=64, error_feedback=False)
    encoded = codec.encode({"x": x})
    y = codec.decode(encoded.tensors, encoded.metadata)["x"]
    for start in range(0, 1000, 64):
        block = x[start : start + 64]
        bound = np.abs(block).max() / 14 * (1 + 1e-6)
        assert np.abs(block - y[start : start + 64]).max() <= bound
    assert encoded.tensors["x.q4"].dtype == np.uint8 and encoded.tensors["x.q4"].size == 500
    assert codec.residual == {}  # without error feedback nothing is kept


@pytest.mark.parametrize("name, options", [("int4", {"block_size": 8}), ("topk8", {"ratio": 0.1, "block_size": 4}),
                                           ("topk", {"ratio": 0.1})])
def test_error_feedback_keeps_exactly_what_was_not_sent(name, options):
    codec = get_codec(name, **options)
    rounds = [sample_update(seed) for seed in range(12)]
    sent = {n: np.zeros(shape, np.float64) for n, shape in SHAPES.items()}
    for update in rounds:
        before = {n: r.copy() for n, r in codec.residual.items()}
        encoded = codec.encode(update)
        decoded = codec.decode(encoded.tensors, encoded.metadata, SHAPES)
        for n, shape in SHAPES.items():  # update + old residual == sent + new residual
            np.testing.assert_allclose(update[n].reshape(-1) + before.get(n, 0.0),
                                       decoded[n].reshape(-1) + codec.residual[n], rtol=0, atol=1e-7)
            sent[n] += decoded[n]
    for n, shape in SHAPES.items():  # over the rounds: nothing lost, only delayed
        total = sum(update[n].astype(np.float64) for update in rounds)
        np.testing.assert_allclose(sent[n] + codec.residual[n].reshape(shape), total, rtol=0, atol=2e-6)


def test_int4_feedback_beats_plain_rounding_over_rounds():
    # a constant update smaller than half a step of its block: plain int4 rounds it to zero every
    # round; with error feedback it accumulates and is sent
    x = np.full(64, 0.01, np.float32)
    x[0] = 1.0  # scale 1/7: 0.01 is far below half a step (0.071)
    plain, fed = Int4Codec(error_feedback=False), Int4Codec()
    sums = {"plain": np.zeros(64), "fed": np.zeros(64)}
    for _ in range(50):
        for key, codec in (("plain", plain), ("fed", fed)):
            encoded = codec.encode({"x": x})
            sums[key] += codec.decode(encoded.tensors, encoded.metadata)["x"]
    assert np.allclose(sums["plain"][1:], 0.0)
    np.testing.assert_allclose(sums["fed"][1:], 50 * 0.01, atol=1 / 7)  # within one step of the truth


def test_topk8_sends_k_entries_rounded_to_int8():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(1000).astype(np.float32)
    codec = TopKInt8Codec(ratio=0.05, block_size=16, error_feedback=False)
    encoded = codec.encode({"x": x})
    y = codec.decode(encoded.tensors, encoded.metadata)["x"]
    index = encoded.tensors["x.idx"]
    assert index.size == 50 and np.count_nonzero(y) <= 50
    assert set(index.tolist()) == set(np.argsort(-np.abs(x))[:50].tolist())  # the 50 largest magnitudes
    values = x[index]
    for start in range(0, 50, 16):
        block = values[start : start + 16]
        assert np.abs(block - y[index][start : start + 16]).max() <= np.abs(block).max() / 254 * (1 + 1e-6)


@pytest.mark.parametrize(
    "codec, options, mutate, message",
    [
        ("int4", {}, lambda t, m: t.update({"x.q4": t["x.q4"][:-1]}), "x.q4"),
        ("int4", {}, lambda t, m: t["x.q4"].__setitem__(0, 0x80), r"\[-7, 7\]"),  # low nibble 0 = code -8
        ("int4", {}, lambda t, m: t["x.q4"].__setitem__(-1, 0x18), "padding"),  # the padding nibble must be 8
        ("int4", {}, lambda t, m: t["x.scale"].__setitem__(0, -1.0), "finite and >= 0"),
        ("int4", {}, lambda t, m: t.update({"x.scale": t["x.scale"].astype(np.float64)}), "float32"),
        ("int4", {}, lambda t, m: m.update(options={"block_size": 0}), "block_size"),
        ("topk8", {"ratio": 0.3}, lambda t, m: t["x.idx"].__setitem__(0, 99), "indices"),
        ("topk8", {"ratio": 0.3}, lambda t, m: t.update({"x.q": t["x.q"].astype(np.int16)}), "int8"),
        ("topk8", {"ratio": 0.3}, lambda t, m: t["x.scale"].__setitem__(0, np.nan), "finite"),
        ("topk8", {"ratio": 0.3}, lambda t, m: t.update({"x.idx": np.array([4, 2, 9], np.uint32)}), "strictly"),
    ],
)
def test_low_bit_decode_refuses_malformed_encodings(codec, options, mutate, message):
    encoded = get_codec(codec, **options).encode({"x": np.linspace(-1, 1, 11, dtype=np.float32)})
    tensors, metadata = dict(encoded.tensors), dict(encoded.metadata)
    mutate(tensors, metadata)
    with pytest.raises(WireError, match=message):
        decode(tensors, metadata, expected_shapes={"x": (11,)})


@pytest.mark.parametrize("name", ["fp32", "int8", "bf16"])
def test_decode_without_copy_gives_the_same_values_and_fp32_the_received_arrays(name):
    rng = np.random.default_rng(0)
    update = {"w": rng.standard_normal((6, 70)).astype(np.float32), "b": rng.standard_normal(9).astype(np.float32)}
    encoded = get_codec(name).encode(update)
    tensors, meta = unpack(pack(encoded.tensors, encoded.metadata), copy=False)
    copied = decode(tensors, meta)
    viewed = decode(tensors, meta, copy=False)
    for key in update:
        np.testing.assert_array_equal(viewed[key], copied[key])
        assert not any(np.shares_memory(copied[key], t) for t in tensors.values())
        assert any(np.shares_memory(viewed[key], t) for t in tensors.values()) == (name == "fp32")


@pytest.mark.parametrize("block_size", [256, 7])
def test_int8_encodes_large_tensors_in_pieces_that_join_into_the_whole_encoding(monkeypatch, block_size):
    # a tensor larger than a piece is encoded piece by piece on the pool's threads; the pieces' codes
    # and scales put end to end must be the one-piece encoding bit for bit (pieces are whole blocks)
    import coop.codec.dense as dense

    rng = np.random.default_rng(3)
    update = {"big": (rng.standard_normal((301, 97)) * 1e-2).astype(np.float32),  # 29197: no whole number of pieces
              "small": rng.standard_normal(5).astype(np.float32)}
    whole = Int8Codec(block_size).encode(update)
    monkeypatch.setattr(dense, "PIECE", 1000)
    codec = Int8Codec(block_size)
    assert 0 < codec.piece_elements() < update["big"].size and codec.piece_elements() % block_size == 0
    pieces = codec.encode(update)
    assert pieces.metadata == whole.metadata and list(pieces.tensors) == list(whole.tensors)
    for name, array in whole.tensors.items():
        assert pieces.tensors[name].dtype == array.dtype
        np.testing.assert_array_equal(pieces.tensors[name], array, err_msg=name)
    bad = dict(update, big=update["big"].copy())
    bad["big"][-1, -1] = np.nan  # in the last piece
    with pytest.raises(ValueError, match="'big' has NaN"):
        codec.encode(bad)


def test_int8_decodes_large_tensors_in_pieces_to_the_whole_decoding_and_refuses_the_same(monkeypatch):
    import coop.codec.dense as dense

    rng = np.random.default_rng(4)
    update = {"big": (rng.standard_normal((301, 97)) * 1e-2).astype(np.float32), "small": rng.standard_normal(5).astype(np.float32)}
    encoded = Int8Codec(7).encode(update)
    whole = Int8Codec(7).decode(encoded.tensors, encoded.metadata)
    monkeypatch.setattr(dense, "PIECE", 1000)
    codec = Int8Codec(7)
    pieces = codec.decode(encoded.tensors, encoded.metadata)
    assert list(pieces) == list(whole)
    for name, array in whole.items():
        assert pieces[name].shape == array.shape and pieces[name].dtype == np.float32
        np.testing.assert_array_equal(pieces[name], array, err_msg=name)
    short = dict(encoded.tensors, **{"big.q": encoded.tensors["big.q"][:-1]})
    with pytest.raises(WireError, match="big.q"):
        codec.decode(short, encoded.metadata)
    negative = dict(encoded.tensors, **{"big.scale": -encoded.tensors["big.scale"]})
    with pytest.raises(WireError, match="scales must be finite and >= 0"):
        codec.decode(negative, encoded.metadata)
