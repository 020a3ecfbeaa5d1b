"""Frame stores that are crafted or damaged, saves that fail half-way, bad pushes."""

import json
import os
import pathlib

import numpy as np
import pytest

from imitation_accum import PreferenceDataset
from imitation_accum.io import atomic, frame_store
from imitation_accum.io.frame_store import StoreError
from tests.test_frame_store import assert_same_pairs, make_pairs, saved


def edit_manifest(path: pathlib.Path, edit) -> None:
    manifest_path = path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    edit(manifest)
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("key", ["bytes", "sha256", "shape", "dtype", "file"])
def test_an_incomplete_entry_is_named(rng, tmp_path, key):
    _, path, _, _ = saved(rng, tmp_path)
    edit_manifest(path, lambda m: m["arrays"]["acts"].pop(key))
    with pytest.raises(StoreError) as error:
        PreferenceDataset.load(path)
    message = str(error.value)
    assert str(path / "manifest.json") in message
    assert "'acts'" in message and repr(key) in message


def test_a_shape_that_overflows_int64_is_named(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    edit_manifest(path, lambda m: m["arrays"]["frames"].update(shape=[2**40, 2**40]))
    with pytest.raises(StoreError, match=r"manifest\.json: array 'frames'.*bytes"):
        PreferenceDataset.load(path)


@pytest.mark.parametrize("bytes_too", [False, True])
def test_a_huge_shape_is_checked_against_the_file_size(rng, tmp_path, bytes_too):
    """Manifest and header agree on a shape far larger than the file holds."""
    _, path, _, _ = saved(rng, tmp_path)
    frames = path / "frames.npy"
    with open(frames, "rb") as file:
        np.lib.format.read_magic(file)
        shape, _, dtype = np.lib.format.read_array_header_1_0(file)
        data = file.read()
    huge = (10**6, *shape[1:])
    with open(frames, "wb") as file:
        header = {"descr": dtype.str, "fortran_order": False, "shape": huge}
        np.lib.format.write_array_header_1_0(file, header)
        file.write(data)
    n_bytes = int(np.prod(huge)) * dtype.itemsize

    def grow(manifest):
        manifest["arrays"]["frames"]["shape"] = list(huge)
        if bytes_too:
            manifest["arrays"]["frames"]["bytes"] = n_bytes

    edit_manifest(path, grow)
    named = (
        r"frames\.npy: \d+ bytes of data.*truncated"
        if bytes_too
        else rf"array 'frames': shape .* needs {n_bytes} bytes, the entry records"
    )
    with pytest.raises(StoreError, match=named):
        PreferenceDataset.load(path)


def test_bytes_that_disagree_with_the_shape_are_named(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    edit_manifest(path, lambda m: m["arrays"]["acts"].update(bytes=10**12))
    with pytest.raises(StoreError, match=r"array 'acts'.*needs \d+ bytes.*10{12}"):
        PreferenceDataset.load(path)


def test_an_object_dtype_is_refused(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    edit_manifest(path, lambda m: m["arrays"]["acts"].update(dtype="|O"))
    with pytest.raises(StoreError, match=r"array 'acts'.*not a plain dtype"):
        PreferenceDataset.load(path)


def rewrite_array(path: pathlib.Path, name: str, array: np.ndarray) -> None:
    """Replaces one array of a store, its manifest entry made consistent."""
    file = path / f"{name}.npy"
    np.save(file, array)
    with open(file, "rb") as handle:
        np.lib.format.read_magic(handle)
        np.lib.format.read_array_header_1_0(handle)
        offset = handle.tell()
    entry = frame_store.describe(
        {name: [array]}, {name: (array.shape, array.dtype)}, {}
    )
    assert file.stat().st_size == offset + entry["arrays"][name]["bytes"]
    edit_manifest(path, lambda m: m["arrays"].update(entry["arrays"]))


def test_infos_that_are_not_json_are_named_at_access(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    infos = np.load(path / "infos.npy").copy()
    infos[0] = ord("}")  # consistent digest: the store loads
    rewrite_array(path, "infos", infos)
    loaded = PreferenceDataset.load(path)
    loaded[1]  # other pairs read back
    with pytest.raises(StoreError, match=r"infos\.npy: the infos of pair 0, side 0"):
        loaded[0]


def test_infos_that_are_json_but_not_infos_are_named(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    loaded = PreferenceDataset.load(path)
    start, size = loaded._columns["info_spans"].take(np.array([0]))[0]
    infos = np.load(path / "infos.npy").copy()
    infos[start : start + size] = np.frombuffer(b"7".ljust(size), np.uint8)
    rewrite_array(path, "infos", infos)
    with pytest.raises(StoreError, match=r"infos\.npy: the infos of pair 0"):
        PreferenceDataset.load(path)[0]


@pytest.mark.parametrize(
    ("obs_shape", "channels", "named"),
    [
        ([12, 12, 6], 4, "channels=4 does not divide"),  # numpy broadcast error before
        ([12, 12, 4], 3, "channels=3 does not divide"),
        ([12, 12, 4], 0, "channels=0"),
        ([12, 12, 8], 1, r"obs_shape=\[12, 12, 8\] and channels=1 need \(8,\)"),
        ([144, 4], 1, r"frames\.npy: frames of shape \(12, 12, 1\), but the manifest"),
        ("12x12", 1, "obs_shape='12x12' is not a list"),
    ],
)
def test_a_layout_that_disagrees_with_the_frames_is_named(
    rng, tmp_path, obs_shape, channels, named
):
    _, path, _, _ = saved(rng, tmp_path)

    def relayout(manifest):
        manifest["metadata"].update(obs_shape=obs_shape, channels=channels)

    edit_manifest(path, relayout)
    with pytest.raises(StoreError, match=named):
        PreferenceDataset.load(path)


def test_a_store_of_unsplit_frames_with_a_wider_obs_shape_is_named(rng, tmp_path):
    """Frames of 4 channels kept whole; obs_shape claims 6: depth 1 either way."""
    dataset = PreferenceDataset()
    pairs = make_pairs(rng, 2)
    for pair in pairs:
        for frag in pair:  # no longer a stack: each observation is its own frame
            object.__setattr__(frag, "obs", rng.integers(0, 255, frag.obs.shape, "u1"))
    dataset.push(pairs, np.array([0.5, 1.0], np.float32))
    assert dataset.layout is not None and dataset.layout.depth == 1
    path = tmp_path / "store"
    dataset.save(path)
    edit_manifest(path, lambda m: m["metadata"].update(obs_shape=[12, 12, 6]))
    with pytest.raises(StoreError, match=r"manifest\.json: metadata channels=4"):
        PreferenceDataset.load(path)


def test_an_index_array_of_another_dtype_is_named(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    fragments = np.load(path / "fragments.npy").astype(np.float64)
    rewrite_array(path, "fragments", fragments)
    with pytest.raises(StoreError, match=r"fragments\.npy: dtype float64 is not"):
        PreferenceDataset.load(path)


# -- saving over a store that fails half-way -------------------------------------


def failing_second_replace(monkeypatch, fail_after: int = 1):
    """os.replace that raises EIO on call ``fail_after + 1`` and later ones."""
    calls = []
    real = os.replace

    def replace(source, target):
        if pathlib.Path(target).name == "manifest.json":  # written inside the new
            return real(source, target)
        calls.append((source, target))
        if len(calls) > fail_after:
            raise OSError(5, "Input/output error (simulated)")
        return real(source, target)

    monkeypatch.setattr(os, "replace", replace)
    return calls


def store_files(path: pathlib.Path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "move-aside"])
def test_saving_over_a_store_swaps_it_in(rng, tmp_path, monkeypatch, exchange):
    _, path, _, _ = saved(rng, tmp_path)
    if not exchange:
        monkeypatch.setattr(atomic, "_exchange", lambda source, target: False)
    pairs = make_pairs(rng, 3)
    prefs = np.array([0.0, 1.0, 0.5], np.float32)
    new = PreferenceDataset()
    new.push(pairs, prefs)
    new.save(path)
    assert_same_pairs(PreferenceDataset.load(path), pairs, prefs)
    assert [p.name for p in tmp_path.iterdir()] == ["store"]  # nothing left aside


def test_renameat2_swaps_two_directories(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "x").write_text("a")
    (tmp_path / "b" / "x").write_text("b")
    # Linux on ext4/tmpfs/xfs/btrfs: the swap is offered; test machines are such.
    assert atomic._exchange(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "a" / "x").read_text() == "b"
    assert (tmp_path / "b" / "x").read_text() == "a"


def test_a_failed_swap_leaves_the_old_store(rng, tmp_path, monkeypatch):
    _, path, _, _ = saved(rng, tmp_path)
    before = store_files(path)

    def fail(source, target):
        raise OSError(5, "Input/output error (simulated)")

    monkeypatch.setattr(atomic, "_exchange", fail)
    new = PreferenceDataset()
    new.push(make_pairs(rng, 2), np.array([0.0, 1.0], np.float32))
    with pytest.raises(OSError, match="simulated"):
        new.save(path)
    assert store_files(path) == before
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


def test_a_failed_move_in_puts_the_old_store_back(rng, tmp_path, monkeypatch):
    """Moving the new store in fails (EIO): the old one is moved back, and said so."""
    _, path, pairs, prefs = saved(rng, tmp_path)
    before = store_files(path)
    monkeypatch.setattr(atomic, "_exchange", lambda source, target: False)
    real = os.replace
    calls = []

    def replace(source, target):  # old aside, new in (fails), old back
        if pathlib.Path(target).name == "manifest.json":  # written inside the new
            return real(source, target)
        calls.append(target)
        if len(calls) == 2:
            raise OSError(5, "Input/output error (simulated)")
        return real(source, target)

    monkeypatch.setattr(os, "replace", replace)
    new = PreferenceDataset()
    new.push(make_pairs(rng, 2), np.array([0.0, 1.0], np.float32))
    with pytest.raises(OSError) as error:
        new.save(path)
    assert len(calls) == 3
    message = str(error.value)
    assert "simulated" in message and f"{path} still holds the old one" in message
    assert store_files(path) == before
    assert_same_pairs(PreferenceDataset.load(path), pairs, prefs)
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


def test_when_the_old_store_cannot_go_back_both_are_named(rng, tmp_path, monkeypatch):
    _, path, pairs, prefs = saved(rng, tmp_path)
    monkeypatch.setattr(atomic, "_exchange", lambda source, target: False)
    failing_second_replace(monkeypatch, fail_after=1)
    new_pairs = make_pairs(rng, 2)
    new_prefs = np.array([0.0, 1.0], np.float32)
    new = PreferenceDataset()
    new.push(new_pairs, new_prefs)
    with pytest.raises(atomic.ReplaceError) as error:
        new.save(path)
    monkeypatch.undo()
    message = str(error.value)
    old_at = pathlib.Path(message.split("the old one is at ")[1].split(",")[0])
    new_at = pathlib.Path(message.split("the new one at ")[1])
    assert old_at.parent == new_at.parent == tmp_path
    assert_same_pairs(PreferenceDataset.load(old_at), pairs, prefs)
    assert_same_pairs(PreferenceDataset.load(new_at), new_pairs, new_prefs)


def test_a_target_that_is_not_a_store_is_refused_before_writing(rng, tmp_path):
    dataset, _, _, _ = saved(rng, tmp_path)
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    with pytest.raises(FileExistsError, match=r"notes\.txt exists and is not a"):
        dataset.save(file)
    assert file.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "store"]


# -- preferences -----------------------------------------------------------------


@pytest.mark.parametrize("bad", [1.5, -0.1, np.nan, np.inf])
def test_a_preference_outside_the_unit_interval_is_refused(rng, bad):
    dataset = PreferenceDataset()
    prefs = np.array([0.5, 1.0, bad], np.float32)
    with pytest.raises(ValueError, match=r"preferences\[2\]=.* outside \[0, 1\]"):
        dataset.push(make_pairs(rng, 3), prefs)
    assert len(dataset) == 0


def test_preferences_are_read_only(rng, tmp_path):
    dataset, path, _, prefs = saved(rng, tmp_path)
    for data in (dataset, PreferenceDataset.load(path), PreferenceDataset()):
        with pytest.raises(ValueError, match="read-only"):
            data.preferences[:1] = 0.25
    np.testing.assert_array_equal(dataset.preferences, prefs)


# -- the environment id ------------------------------------------------------------


def test_env_id_is_recorded_and_kept(rng, tmp_path):
    dataset, path, _, _ = saved(rng, tmp_path)
    assert dataset.env_id is None and PreferenceDataset.load(path).env_id is None
    assert "env_id" not in json.loads((path / "manifest.json").read_text())
    fingerprint = dataset.fingerprint()
    dataset.save(path, env_id="seals/Pong-v5")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["env_id"] == "seals/Pong-v5"
    assert dataset.env_id == "seals/Pong-v5"
    loaded = PreferenceDataset.load(path)
    assert loaded.env_id == "seals/Pong-v5"
    assert loaded.fingerprint() == fingerprint  # provenance, not content
    # Re-saving a loaded store keeps it, after pushes too; a new one replaces it.
    loaded.push(make_pairs(rng, 1), np.array([1.0], np.float32))
    loaded.save(tmp_path / "copy")
    assert PreferenceDataset.load(tmp_path / "copy").env_id == "seals/Pong-v5"
    loaded.save(tmp_path / "copy", env_id="CartPole-v1")
    assert PreferenceDataset.load(tmp_path / "copy").env_id == "CartPole-v1"
    assert PreferenceDataset().env_id is None


def test_a_bad_env_id_is_named(rng, tmp_path):
    dataset, path, _, _ = saved(rng, tmp_path)
    with pytest.raises(TypeError, match="env_id=3"):
        dataset.save(path, env_id=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="env_id=''"):
        dataset.save(path, env_id="")
    edit_manifest(path, lambda m: m.update(env_id=["Pong"]))
    with pytest.raises(StoreError, match=r"manifest\.json: 'env_id' is \['Pong'\]"):
        PreferenceDataset.load(path)
