"""coop.wire: safetensors round trips and refusal of bad network input."""

import json
import struct

import numpy as np
import pytest

from coop.wire import (
    TensorSpec,
    WireError,
    check_metadata,
    check_tensors,
    lay_out,
    pack,
    pack_view,
    spec_of,
    unpack,
)


def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "wte.weight": rng.standard_normal((5, 3)).astype(np.float32),
        "h.0.q": rng.integers(-127, 128, size=17).astype(np.int8),
        "h.0.scale": rng.random(3).astype(np.float32),
        "bf16": rng.integers(0, 2**16, size=(2, 2)).astype(np.uint16),
        "idx": np.arange(4, dtype=np.uint32),
        "half": rng.standard_normal(6).astype(np.float16),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def test_round_trip_keeps_names_dtypes_shapes_values_and_metadata():
    tensors = sample_tensors()
    metadata = {"round": 3, "codec": "int8", "options": {"block_size": 256}, "worker": "ana", "loss": 1.25}
    data = pack(tensors, metadata)
    assert isinstance(data, bytes)
    got, got_metadata = unpack(data)
    assert got_metadata == metadata
    assert set(got) == set(tensors)
    for name, array in tensors.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        np.testing.assert_array_equal(got[name], array)
        assert got[name].flags.writeable


def test_metadata_sits_in_the_safetensors_header_as_a_json_string():
    data = pack({"a": np.ones(2, np.float32)}, {"k": [1, 2]})
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    assert json.loads(header["__metadata__"]["json"]) == {"k": [1, 2]}


def test_non_contiguous_and_big_endian_inputs_are_written_correctly():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensors = {"t": base.T, "be": np.arange(3, dtype=">f4")}
    got, _ = unpack(pack(tensors))
    np.testing.assert_array_equal(got["t"], base.T)
    np.testing.assert_array_equal(got["be"], np.arange(3, dtype=np.float32))


def test_pack_refuses_bad_input():
    with pytest.raises(TypeError, match="dtype"):
        pack({"b": np.zeros(2, dtype=bool)})
    with pytest.raises(TypeError, match="numpy array"):
        pack({"l": [1.0, 2.0]})
    with pytest.raises(ValueError, match="JSON"):
        pack({}, {"x": float("nan")})
    with pytest.raises(ValueError, match="__metadata__"):
        pack({"__metadata__": np.zeros(1, np.float32)})


def test_oversized_input_is_refused():
    data = pack({"a": np.zeros(100, np.float32)})
    with pytest.raises(WireError, match="limit"):
        unpack(data, max_bytes=len(data) - 1)
    unpack(data, max_bytes=len(data))


@pytest.mark.parametrize("cut", [0, 5, 8, 20, -1, -4])
def test_truncated_input_is_refused(cut):
    data = pack({"a": np.arange(10, dtype=np.float32), "b": np.ones(3, np.int8)}, {"r": 1})
    truncated = data[:cut]
    with pytest.raises(WireError):
        unpack(truncated)


def test_trailing_bytes_are_refused():
    data = pack({"a": np.arange(10, dtype=np.float32)})
    with pytest.raises(WireError, match="trailing"):
        unpack(data + b"\0\0\0\0")


def raw_message(header: dict, payload: bytes) -> bytes:
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + payload


@pytest.mark.parametrize(
    "header, payload, message",
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "needs 8 bytes"),
        ({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "not accepted"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "shape"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4]}}, b"\0" * 4, "data_offsets"),
        ({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4, "exactly"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
            "gap or overlap",
        ),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "truncated"),
        ({"__metadata__": {"json": "not json"}}, b"", "metadata"),
        ({"__metadata__": {"json": "[1, 2]"}}, b"", "JSON object"),
        ({"__metadata__": {"json": 3}}, b"", "strings"),
    ],
)
def test_malformed_headers_are_refused_with_a_clear_message(header, payload, message):
    with pytest.raises(WireError, match=message):
        unpack(raw_message(header, payload))


def test_garbage_is_refused():
    with pytest.raises(WireError, match="header"):
        unpack(struct.pack("<Q", 4) + b"\xff\xfe{}" + b"")
    with pytest.raises(WireError, match="JSON object"):
        unpack(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(WireError, match="header claims"):
        unpack(struct.pack("<Q", 2**62) + b"{}")
    with pytest.raises(WireError, match="expected bytes"):
        unpack("not bytes")  # type: ignore[arg-type]


def test_wire_error_is_a_value_error():
    assert issubclass(WireError, ValueError)


def test_check_tensors_accepts_a_matching_update_and_names_each_problem():
    model = {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    spec = spec_of(model)
    assert spec["w"] == TensorSpec((2, 3), np.dtype(np.float32))
    check_tensors({"w": np.ones((2, 3), np.float32), "b": np.ones(3, np.float32)}, spec)

    with pytest.raises(WireError, match=r"missing \['b'\], unexpected \['x'\]"):
        check_tensors({"w": np.ones((2, 3), np.float32), "x": np.ones(3, np.float32)}, spec)
    with pytest.raises(WireError, match=r"'w' has shape \(3, 2\), expected \(2, 3\)"):
        check_tensors({"w": np.ones((3, 2), np.float32), "b": np.ones(3, np.float32)}, spec)
    with pytest.raises(WireError, match="dtype float64, expected float32"):
        check_tensors({"w": np.ones((2, 3)), "b": np.ones(3, np.float32)}, spec)
    bad = np.ones(3, np.float32)
    bad[1] = np.nan
    with pytest.raises(WireError, match="1 non-finite"):
        check_tensors({"w": np.ones((2, 3), np.float32), "b": bad}, spec)
    check_tensors({"w": np.ones((2, 3), np.float32), "b": bad}, spec, require_finite=False)


def test_check_metadata():
    check_metadata({"round": 3, "codec": "int8", "tokens": 10}, {"round": int, "codec": str, "tokens": (int, float)})
    with pytest.raises(WireError, match="lacks 'round'"):
        check_metadata({"codec": "int8"}, {"round": int})
    with pytest.raises(WireError, match="'round' should be int, got str"):
        check_metadata({"round": "3"}, {"round": int})
    with pytest.raises(WireError, match="should be int, got bool"):
        check_metadata({"round": True}, {"round": int})


def test_unpack_accepts_memoryview_and_bytearray():
    data = pack({"a": np.arange(3, dtype=np.float32)}, {"x": 1})
    for form in (bytearray(data), memoryview(data)):
        got, metadata = unpack(form)
        np.testing.assert_array_equal(got["a"], np.arange(3, dtype=np.float32))
        assert metadata == {"x": 1}


def test_unpack_copy_false_gives_read_only_views_with_the_same_checks():
    from coop.codec import get_codec

    rng = np.random.default_rng(0)
    update = {"a": rng.standard_normal((30, 7), dtype=np.float32), "b": rng.standard_normal(13, dtype=np.float32),
              "c": np.zeros((0, 3), np.float32), "d": np.array(3.0, np.float32)}
    for codec, options in [("fp32", {}), ("int8", {"block_size": 8}), ("topk", {"ratio": 0.1}), ("bf16", {})]:
        encoded = get_codec(codec, **options).encode(update)
        body = bytearray(pack(encoded.tensors, {**encoded.metadata, "round": 1}))
        copies, meta = unpack(bytes(body))
        views, meta2 = unpack(body, len(body), copy=False)
        assert meta == meta2 and set(views) == set(copies)
        for name, array in copies.items():
            assert views[name].dtype == array.dtype and views[name].shape == array.shape
            assert np.array_equal(views[name], array)
            assert array.flags.writeable and not views[name].flags.writeable
            assert not np.shares_memory(array, np.frombuffer(body, np.uint8))
            assert np.shares_memory(views[name], np.frombuffer(body, np.uint8)) or views[name].size == 0
    body = bytearray(pack(update))
    for bad in (bytearray(), body[:-1], body + b"x", bytearray(b"\xff" * 16)):
        with pytest.raises(WireError):
            unpack(bad, 10**9, copy=False)
    with pytest.raises(WireError, match="limit"):
        unpack(body, len(body) - 1, copy=False)


def test_lay_out_is_the_safetensors_body_of_its_views():
    import safetensors.numpy

    specs = {"b": TensorSpec((3,), np.dtype(np.int8)), "a": TensorSpec((2, 5), np.dtype(np.float32)),
             "s": TensorSpec((), np.dtype(np.float64)), "e": TensorSpec((0, 4), np.dtype(np.float32))}
    laid = lay_out(specs, {"round": 7})
    assert list(laid.tensors) == list(specs)  # in the caller's order, whatever the layout's
    values = {"b": np.array([1, -2, 3], np.int8), "a": np.arange(10, dtype=np.float32).reshape(2, 5),
              "s": np.float64(2.5), "e": np.zeros((0, 4), np.float32)}
    for name, array in laid.tensors.items():
        assert array.flags.writeable and array.shape == specs[name].shape and array.ctypes.data % array.itemsize == 0
        array[...] = values[name]
    tensors, meta = unpack(laid.body)
    assert meta == {"round": 7}
    for name, value in values.items():
        np.testing.assert_array_equal(tensors[name], value)
    loaded = safetensors.numpy.load(bytes(laid.body))  # the library reads it too
    np.testing.assert_array_equal(loaded["a"], values["a"])
    assert (8 + int.from_bytes(bytes(laid.body[:8]), "little")) % 8 == 0  # the data starts 8-aligned
    with pytest.raises(TypeError, match="cannot go on the wire"):
        lay_out({"x": TensorSpec((2,), np.dtype(np.complex64))})
    with pytest.raises(ValueError, match="JSON-able"):
        lay_out(specs, {"bad": float("nan")})


def test_laid_out_tensors_of_one_dtype_are_one_flat_vector_in_their_order():
    specs = {"z": TensorSpec((2, 3), np.dtype(np.float32)), "a": TensorSpec((4,), np.dtype(np.float32)),
             "i": TensorSpec((5,), np.dtype(np.int8))}
    laid = lay_out(specs)
    flat = laid.flat(["z", "a"])
    flat[:] = np.arange(10)
    np.testing.assert_array_equal(laid.tensors["z"], np.arange(6).reshape(2, 3))
    np.testing.assert_array_equal(laid.tensors["a"], np.arange(6, 10))
    assert laid.flat(["a", "z"]) is None and laid.flat(["z", "i"]) is None and laid.flat(["z"]).size == 6
    np.testing.assert_array_equal(unpack(laid.body)[0]["a"], np.arange(6, 10))


def test_pack_view_is_a_body_that_unpacks_to_the_same_tensors_and_metadata():
    rng = np.random.default_rng(2)
    tensors = {"w": rng.standard_normal((30, 7)).astype(np.float32), "q": rng.integers(-127, 128, 101).astype(np.int8),
               "s": np.array(1.5, np.float32), "big_endian": np.arange(5, dtype=">f4"),
               "strided": rng.standard_normal((6, 8)).astype(np.float32)[:, ::2]}
    view = pack_view(tensors, {"round": 3})
    got, meta = unpack(view)
    assert meta == {"round": 3} and set(got) == set(tensors)
    for name, array in tensors.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)
    import safetensors.numpy

    np.testing.assert_array_equal(safetensors.numpy.load(bytes(view))["w"], tensors["w"])  # the library reads it
    with pytest.raises(TypeError, match="cannot go on the wire"):
        pack_view({"c": np.zeros(2, np.complex64)})
    with pytest.raises(ValueError, match="non-empty strings"):
        pack_view({"": np.zeros(2, np.float32)})
