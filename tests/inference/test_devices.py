"""inference.evaluator on accelerators and inference.devices, checked on the CPU.

A tiny real network (model.network, exported by model.export and loaded
through format.registry, as a worker loads it) is evaluated plainly and
through the fixed-shape path that a TPU needs: the padded outputs must equal
the plain ones row for row, for batches below, at, between and above the
bucket sizes, and the fixed-signature tf.function must be traced once per
bucket however many batch sizes it sees.  The device flag's grammar and the
CPU placement are checked too; GPU and TPU placements cannot run here.
"""
import numpy as np
import pytest
import tensorflow as tf

from cloud.storage import open_storage
from format import schema
from format.registry import publish_model
from inference.model_files import load_model
from model.export import export_inference_model
from model.config import NetworkConfig
from model.network import build_network
from selfplay.config import WorkerConfig
from inference.devices import Placement, configure_accelerator, cpu_has_bf16_matrix_unit, parse_device
from inference.evaluator import FixedShapeFunction, ModelEvaluator, bucket_sizes, padded_pieces

BUCKETS = (8, 32, 64)
# below the first bucket, at each bucket, between buckets, above the largest
BATCH_SIZES = (1, 7, 8, 9, 20, 32, 33, 63, 64, 65, 100, 130)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """A tiny 9x9 network, published to a local lake and loaded back."""
    config = NetworkConfig(board_size=9, blocks=1, filters=8, global_pool_every=1,
                           global_pool_channels=4, value_hidden=8)
    network = build_network(config)
    base = tmp_path_factory.mktemp("accelerator")
    export_inference_model(config, [w.numpy() for w in network.weights], str(base / "model"))
    storage = open_storage(str(base / "lake"))
    publish_model(storage, 1, str(base / "model"), {"board_size": 9})
    return load_model(storage, 1, cache_dir=str(base / "cache"))


def random_planes(rng, batch, n=9):
    planes = (rng.random((batch, n, n, schema.BASIC_INPUT_PLANES)) < 0.3).astype(np.float32)
    planes[..., 16] = rng.integers(0, 2, size=(batch, 1, 1))
    return planes


def test_padded_outputs_equal_plain_outputs_for_every_batch_size(loaded):
    plain = ModelEvaluator(loaded, devices=[], pad_to=None)
    padded = ModelEvaluator(loaded, devices=[], pad_to=BUCKETS)
    assert plain.buckets is None and padded.buckets == BUCKETS
    rng = np.random.default_rng(0)
    for batch in BATCH_SIZES:
        planes = random_planes(rng, batch)
        logits, values = padded(planes)
        want_logits, want_values = plain(planes)
        assert logits.shape == (batch, 82) and values.shape == (batch,)
        np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(values, want_values, rtol=1e-5, atol=1e-6)


def test_padding_keeps_row_order(loaded):
    """Each row's output is the one it gets alone, wherever it sits in the batch."""
    padded = ModelEvaluator(loaded, devices=[], pad_to=BUCKETS)
    planes = random_planes(np.random.default_rng(1), 70)   # two pieces: 64 + 6 padded to 8
    logits, values = padded(planes)
    for row in (0, 5, 63, 64, 69):
        alone_logits, alone_values = padded(planes[row:row + 1])
        np.testing.assert_allclose(logits[row], alone_logits[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(values[row], alone_values[0], rtol=1e-5, atol=1e-6)
    reversed_logits, _ = padded(planes[::-1].copy())
    np.testing.assert_allclose(reversed_logits[::-1], logits, rtol=1e-5, atol=1e-5)


def test_fixed_signature_traces_once_per_bucket(loaded):
    padded = ModelEvaluator(loaded, devices=[], pad_to=BUCKETS)
    rng = np.random.default_rng(2)
    for batch in list(BATCH_SIZES) + [3, 50, 17, 64, 2]:
        padded(random_planes(rng, batch))
    assert padded.fixed.traces == len(BUCKETS)

    one_size = ModelEvaluator(loaded, devices=[], pad_to=64)
    for batch in range(1, 65, 3):
        one_size(random_planes(rng, batch))
    assert one_size.fixed.traces == 1


def test_fixed_shape_function_refuses_other_shapes(loaded):
    fixed = FixedShapeFunction(lambda planes: loaded._signature(planes=planes), 9)
    fixed(random_planes(np.random.default_rng(3), 8))
    with pytest.raises((TypeError, ValueError)):
        fixed.function_for(8)(random_planes(np.random.default_rng(3), 5))
    assert fixed.traces == 1


def test_pieces_cover_every_row_once_in_order():
    for rows in range(1, 200):
        pieces = padded_pieces(rows, BUCKETS)
        assert [p[0] for p in pieces] == list(range(0, rows, 64))
        assert pieces[-1][1] == rows
        for start, stop, size in pieces:
            assert size in BUCKETS and size >= stop - start
            assert size == min(b for b in BUCKETS if b >= stop - start)
    assert bucket_sizes([30, 8, 8], multiple=8) == (8, 32)
    assert bucket_sizes(None) is None
    with pytest.raises(ValueError, match="pad_to"):
        bucket_sizes([0])


def test_padding_is_off_by_default_off_tpu(loaded):
    assert ModelEvaluator(loaded, devices=[]).buckets is None
    assert ModelEvaluator(loaded, placement=Placement("cpu", "/device:CPU:0")).buckets is None


@pytest.mark.parametrize("device, parsed", [
    ("", ("default", None)), ("cpu", ("cpu", None)), ("gpu", ("gpu", None)),
    ("gpu:1", ("gpu", 1)), ("GPU:0", ("gpu", 0)), ("tpu", ("tpu", None))])
def test_device_flag_grammar(device, parsed):
    assert parse_device(device) == parsed
    assert WorkerConfig(root="unused", device=device).device == device


@pytest.mark.parametrize("device", ["cuda", "cpu:0", "tpu:1", "gpu:", "gpu:x", " gpu"])
def test_bad_device_is_refused_naming_the_flag(device):
    with pytest.raises(ValueError, match="--device"):
        WorkerConfig(root="unused", device=device)


def test_cpu_placement_runs_the_model_on_the_cpu(loaded):
    placement = configure_accelerator("cpu")
    assert placement == Placement("cpu", "/device:CPU:0")
    evaluator = ModelEvaluator(loaded, placement=placement)
    assert evaluator.devices == ["/device:CPU:0"]
    planes = random_planes(np.random.default_rng(4), 5)
    logits, values = evaluator(planes)
    want = loaded(planes)
    np.testing.assert_allclose(logits, want["policy_logits"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values, want["value"], rtol=1e-5, atol=1e-6)
    if not tf.config.list_physical_devices("GPU"):
        with pytest.raises(ValueError, match="--device gpu:0: TensorFlow sees no GPU"):
            configure_accelerator("gpu:0")


def test_the_trainer_picks_bfloat16_only_on_cpus_with_amx(tmp_path):
    """--precision auto reads the CPU: bfloat16 is 1.1-1.7x faster with AMX's tile unit, slower without."""
    from model.config import TrainConfig
    from model.sgd import dtype_policy_for

    amx, avx512 = tmp_path / "amx", tmp_path / "avx512"
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n")
    avx512.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni avx512_bf16\n")
    assert cpu_has_bf16_matrix_unit(str(amx)) and not cpu_has_bf16_matrix_unit(str(avx512))
    assert not cpu_has_bf16_matrix_unit(str(tmp_path / "absent"))
    auto = TrainConfig(root="/tmp/x")
    assert auto.precision == "auto"
    assert dtype_policy_for(auto, "cpu", cpu_bf16=True) == "mixed_bfloat16"
    assert dtype_policy_for(auto, "cpu", cpu_bf16=False) == "float32"
    assert dtype_policy_for(auto, "gpu", cpu_bf16=False) == "mixed_bfloat16"
    pinned = TrainConfig(root="/tmp/x", precision="float32")
    assert dtype_policy_for(pinned, "cpu", cpu_bf16=True) == "float32"
