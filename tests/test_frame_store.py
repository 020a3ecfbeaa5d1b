"""The frame store: frame stacks kept once, exact reads, eviction, files, errors."""

import gc
import json
import os
import pathlib
import weakref
from typing import List, Tuple

import gymnasium as gym
import numpy as np
import pytest
from imitation.algorithms import preference_comparisons as pc
from imitation.data import types

from imitation_accum import PreferenceDataset
from imitation_accum.io import frame_store
from imitation_accum.io.frame_store import StoreError
from imitation_accum.preference import dataset as store_dataset

FRAME = (12, 12)
STACK = 4
Pair = Tuple[types.TrajectoryWithRew, types.TrajectoryWithRew]


def stack_frames(frames: np.ndarray, k: int = STACK) -> np.ndarray:
    """What SB3's ``VecFrameStack`` (channels last) gives for one episode's frames.

    Written plainly, independently of the store: at step ``t`` the last ``k``
    frames, oldest first, zeros before the episode's first frame.
    """
    n = len(frames)
    out = np.zeros((n, *frames.shape[1:-1], k * frames.shape[-1]), frames.dtype)
    c = frames.shape[-1]
    for t in range(n):
        for slot in range(k):
            source = t - (k - 1) + slot
            if source >= 0:
                out[t, ..., slot * c : (slot + 1) * c] = frames[source]
    return out


def episode(rng: np.random.Generator, steps: int, channels: int = 1) -> np.ndarray:
    """Stacked observations of one episode of random frames (``steps + 1`` of them)."""
    frames = rng.integers(0, 256, (steps + 1, *FRAME, channels), dtype=np.uint8)
    return stack_frames(frames)


def fragment_of(
    obs: np.ndarray,
    start: int,
    length: int,
    rng: np.random.Generator,
    terminal: bool = False,
) -> types.TrajectoryWithRew:
    """A fragment that is a view into an episode's observations, as imitation's are.

    Its infos are as a gymnasium env and SB3 give them: numbers, flags and, on an
    episode's last step, the terminal observation.
    """
    infos = np.empty(length, dtype=object)
    infos[:] = [{"step": start + t, "lives": np.int64(3)} for t in range(length)]
    if terminal:
        infos[-1] = {"TimeLimit.truncated": False, "terminal_observation": obs[-1]}
    return types.TrajectoryWithRew(
        obs=obs[start : start + length + 1],
        acts=rng.integers(0, 3, length),
        infos=infos,
        terminal=terminal,
        rews=rng.normal(size=length).astype(np.float32),
    )


def make_pairs(
    rng: np.random.Generator,
    n_pairs: int,
    length: int = 6,
    channels: int = 1,
) -> List[Pair]:
    """Pairs of fragments of random episodes, some starting at the episode start."""
    pairs = []
    for i in range(n_pairs):
        sides = []
        for side in range(2):
            obs = episode(rng, 3 * length, channels)
            start = 0 if (i + side) % 3 == 0 else int(rng.integers(1, 2 * length))
            sides.append(fragment_of(obs, start, length, rng, terminal=side == 1))
        pairs.append((sides[0], sides[1]))
    return pairs


def preferences_of(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.uniform(size=n).astype(np.float32)


def imitation_dataset(pairs: List[Pair], prefs: np.ndarray) -> pc.PreferenceDataset:
    dataset = pc.PreferenceDataset()
    dataset.push(pairs, prefs)
    return dataset


def assert_same_pairs(dataset, pairs: List[Pair], prefs: np.ndarray) -> None:
    """Every item of ``dataset`` equals the pair pushed, bit for bit."""
    assert len(dataset) == len(pairs)
    for i, (pair, pref) in enumerate(zip(pairs, prefs)):
        (a, b), p = dataset[i]
        assert p == pref
        for got, want in zip((a, b), pair):
            assert got.obs.dtype == want.obs.dtype
            np.testing.assert_array_equal(got.obs, want.obs)
            np.testing.assert_array_equal(got.acts, want.acts)
            np.testing.assert_array_equal(got.rews, want.rews)
            assert got.terminal == want.terminal
            assert len(got.infos) == len(want.infos)
            for got_info, want_info in zip(got.infos, want.infos):
                assert got_info.keys() == want_info.keys()
                for key, value in want_info.items():
                    np.testing.assert_array_equal(got_info[key], value, strict=True)


def test_items_read_back_bit_for_bit(rng):
    pairs, prefs = make_pairs(rng, 7), preferences_of(rng, 7)
    dataset = PreferenceDataset()
    dataset.push(pairs[:3], prefs[:3])
    dataset.push(pairs[3:], prefs[3:])
    assert_same_pairs(dataset, pairs, prefs)
    reference = imitation_dataset(pairs, prefs)
    np.testing.assert_array_equal(dataset.preferences, reference.preferences)
    assert dataset.preferences.dtype == reference.preferences.dtype
    (firsts, seconds), some = dataset[2:5]
    assert len(firsts) == len(seconds) == 3
    np.testing.assert_array_equal(firsts[1].obs, pairs[3][0].obs)
    np.testing.assert_array_equal(some, reference.preferences[2:5])
    np.testing.assert_array_equal(dataset.fragments2[-1].obs, pairs[-1][1].obs)
    assert len(list(dataset.fragments1)) == 7
    both = dataset.fragments1 + dataset.fragments2
    np.testing.assert_array_equal(both[7].obs, pairs[0][1].obs)


def test_frame_stacks_kept_once(rng):
    """``T`` transitions of ``k``-frame stacks keep ``T + k`` frames."""
    length = 6
    pairs = make_pairs(rng, 5, length=length)
    dataset = PreferenceDataset()
    dataset.push(pairs, preferences_of(rng, 5))
    assert dataset.layout == store_dataset.StackLayout((*FRAME, STACK), 1)
    frame_bytes = int(np.prod(FRAME))
    assert dataset.nbytes["frames"] == 10 * (length + STACK) * frame_bytes
    imitation_bytes = sum(f.obs.nbytes for pair in pairs for f in pair)
    assert imitation_bytes == 10 * (length + 1) * STACK * frame_bytes


def test_colour_stacks_split_by_their_channels(rng):
    pairs = make_pairs(rng, 3, channels=3)
    dataset = PreferenceDataset()
    dataset.push(pairs, preferences_of(rng, 3))
    assert dataset.layout == store_dataset.StackLayout((*FRAME, 3 * STACK), 3)
    assert_same_pairs(dataset, pairs, dataset.preferences)


def test_observations_that_are_not_stacks_are_kept_as_they_are(rng):
    """Random images, a stack broken mid-fragment, vectors: exact, whatever is saved."""
    length = 5
    noise = rng.integers(0, 256, (length + 1, *FRAME, STACK), dtype=np.uint8)
    broken = np.concatenate([episode(rng, 2), episode(rng, length - 3)])
    vectors = rng.normal(size=(length + 1, 4)).astype(np.float32)
    for obs in (noise, broken):
        pair = (fragment_of(obs, 0, length, rng), fragment_of(obs, 0, length, rng))
        dataset = PreferenceDataset()
        dataset.push([pair], np.array([0.5], np.float32))
        assert_same_pairs(dataset, [pair], [0.5])
    pair = (fragment_of(vectors, 0, length, rng), fragment_of(vectors, 0, length, rng))
    dataset = PreferenceDataset()
    dataset.push([pair], np.array([1.0], np.float32))
    assert dataset.layout == store_dataset.StackLayout((4,), 4)
    assert_same_pairs(dataset, [pair], [1.0])


def naive_always_shared(obs, layout):
    """A naive encoder: assumes every observation is its predecessor shifted."""
    k = layout.depth
    frames = [layout.split(obs[:1])[0][j] for j in range(k)]
    frames += [layout.split(obs[t : t + 1])[0][-1] for t in range(1, len(obs))]
    rows = np.arange(len(obs))[:, None] + np.arange(k)
    return np.stack(frames), rows


_encode = store_dataset.encode_frames


def naive_newest_first(obs, layout):
    """A naive encoder with the stack order reversed (newest frame first)."""
    return _encode(obs[..., ::-1], layout)


@pytest.mark.parametrize("naive", [naive_always_shared, naive_newest_first])
def test_a_naive_encoder_fails_the_round_trip(rng, monkeypatch, naive):
    """The round-trip test catches wrongly shared or misordered frames."""
    obs = np.concatenate([episode(rng, 3), episode(rng, 3)])  # an episode start inside
    pair = (fragment_of(obs, 0, 7, rng), fragment_of(obs, 1, 6, rng))
    monkeypatch.setattr(store_dataset, "encode_frames", naive)
    dataset = PreferenceDataset()
    dataset.push([pair], np.array([0.5], np.float32))
    with pytest.raises(AssertionError):
        assert_same_pairs(dataset, [pair], [0.5])


def test_push_copies_frames_out_of_trajectories(rng):
    """No view of an episode is kept: the episode's memory is freed after a push."""
    obs = episode(rng, 30)
    pair = (fragment_of(obs, 2, 6, rng), fragment_of(obs, 10, 6, rng))
    expected = [f.obs.copy() for f in pair]
    alive = weakref.ref(obs)
    dataset = PreferenceDataset()
    dataset.push([pair], np.array([0.25], np.float32))
    del obs, pair
    gc.collect()
    assert alive() is None
    (a, b), _ = dataset[0]
    np.testing.assert_array_equal(a.obs, expected[0])
    np.testing.assert_array_equal(b.obs, expected[1])


def test_eviction_is_oldest_first_and_frees_frames(rng, monkeypatch):
    monkeypatch.setattr(store_dataset, "SEGMENT_BYTES", 4096)
    dataset = PreferenceDataset(max_size=5)
    reference = pc.PreferenceDataset(max_size=5)
    allocated = []
    for _ in range(100):
        pairs, prefs = make_pairs(rng, 3), preferences_of(rng, 3)
        dataset.push(pairs, prefs)
        reference.push(pairs, prefs)
        allocated.append(dataset.allocated_bytes)
    assert len(dataset) == 5
    kept = list(zip(reference.fragments1, reference.fragments2))
    assert_same_pairs(dataset, kept, reference.preferences)
    # Bounded: the last 50 pushes hold no more than the first 50 at their peak.
    assert max(allocated[50:]) <= max(allocated[:50])
    live = sum(dataset.nbytes.values())
    # At most one partly filled segment per array beyond the live rows.
    assert dataset.allocated_bytes < live + len(dataset.nbytes) * 4096 + 16 * 2**10


def test_constructor_and_push_check_their_arguments(rng):
    with pytest.raises(ValueError, match="max_size"):
        PreferenceDataset(max_size=0)
    dataset = PreferenceDataset()
    pairs = make_pairs(rng, 2)
    with pytest.raises(ValueError, match="preferences shape"):
        dataset.push(pairs, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="float32"):
        dataset.push(pairs, np.zeros(2))


def test_a_fragment_with_other_observations_is_named(rng):
    dataset = PreferenceDataset()
    dataset.push(make_pairs(rng, 2), preferences_of(rng, 2))
    pairs = make_pairs(rng, 3)
    small = episode(rng, 10)[:, :8]
    pairs[2] = (pairs[2][0], fragment_of(small, 0, 6, rng))
    with pytest.raises(ValueError, match=r"fragments\[2\]\[1\] has observations"):
        dataset.push(pairs, preferences_of(rng, 3))
    assert len(dataset) == 2  # nothing of the failed push is kept
    fresh = PreferenceDataset()
    with pytest.raises(ValueError, match=r"fragments\[2\]\[1\] has observations"):
        fresh.push(pairs, preferences_of(rng, 3))
    assert len(fresh) == 0


# -- files ----------------------------------------------------------------------


def saved(rng, tmp_path: pathlib.Path, n: int = 6):
    pairs, prefs = make_pairs(rng, n), preferences_of(rng, n)
    dataset = PreferenceDataset(max_size=50)
    dataset.push(pairs, prefs)
    path = tmp_path / "store"
    dataset.save(path)
    return dataset, path, pairs, prefs


def test_save_load_round_trip_memory_mapped(rng, tmp_path):
    dataset, path, pairs, prefs = saved(rng, tmp_path)
    loaded = PreferenceDataset.load(path, verify=True)
    assert_same_pairs(loaded, pairs, prefs)
    assert loaded.max_size == 50
    frames = loaded._columns["frames"].blocks()[0]
    assert isinstance(frames, np.memmap) and not frames.flags.writeable
    assert loaded.fingerprint() == dataset.fingerprint()
    assert sorted(p.name for p in path.iterdir()) == sorted(
        [
            "manifest.json",
            "frames.npy",
            "obs_frames.npy",
            "acts.npy",
            "rews.npy",
            "fragments.npy",
            "preferences.npy",
            "infos.npy",
            "info_spans.npy",
        ],
    )
    # Pushing after loading goes to memory; the files are left as they are.
    more, more_prefs = make_pairs(rng, 2), preferences_of(rng, 2)
    loaded.push(more, more_prefs)
    assert_same_pairs(loaded, pairs + more, np.concatenate([prefs, more_prefs]))
    assert loaded.fingerprint() != dataset.fingerprint()
    assert PreferenceDataset.load(path).fingerprint() == dataset.fingerprint()


def test_fingerprint_follows_content(rng, tmp_path):
    dataset, _, pairs, prefs = saved(rng, tmp_path)
    fresh = PreferenceDataset()
    fresh.push(pairs, prefs)
    assert fresh.fingerprint() == dataset.fingerprint()  # hashed, never saved
    other = PreferenceDataset()
    changed = prefs.copy()
    changed[0] = 1 - changed[0]
    other.push(pairs, changed)
    assert other.fingerprint() != dataset.fingerprint()


def test_saving_over_a_store_replaces_it_atomically(rng, tmp_path):
    _, path, pairs, prefs = saved(rng, tmp_path)
    smaller = PreferenceDataset()
    smaller.push(pairs[:2], prefs[:2])
    smaller.save(path)
    assert len(PreferenceDataset.load(path)) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["store"]  # no temporaries left
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a frame store"):
        smaller.save(tmp_path / "other")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_truncated_frames_are_named(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    frames = path / "frames.npy"
    frames.write_bytes(frames.read_bytes()[:-100])
    with pytest.raises(StoreError, match=r"frames\.npy.*truncated"):
        PreferenceDataset.load(path)


def test_corrupt_index_is_named(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    index = path / "obs_frames.npy"
    data = bytearray(index.read_bytes())
    data[-3] ^= 0xFF
    index.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=r"obs_frames\.npy.*SHA-256"):
        PreferenceDataset.load(path)


def test_corrupt_frames_are_named_by_default(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    frames = path / "frames.npy"
    data = bytearray(frames.read_bytes())
    data[-1] ^= 0xFF
    frames.write_bytes(bytes(data))
    PreferenceDataset.load(path, verify=False)  # sizes agree; frames not hashed
    with pytest.raises(StoreError, match=r"frames\.npy.*SHA-256"):
        PreferenceDataset.load(path)  # the default: hashed


def test_manifest_errors_are_named(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    manifest_path = path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(StoreError, match=r"manifest\.json.*version 99"):
        PreferenceDataset.load(path)
    manifest_path.write_text("{not json")
    with pytest.raises(StoreError, match=r"manifest\.json.*unreadable"):
        PreferenceDataset.load(path)
    manifest_path.unlink()
    with pytest.raises(StoreError, match=r"manifest\.json.*missing"):
        PreferenceDataset.load(path)
    with pytest.raises(StoreError, match="no such"):
        PreferenceDataset.load(tmp_path / "nowhere")


def store_with_acts_elsewhere(rng, tmp_path):
    """A store, and a valid copy of its actions outside it (what a bad store names)."""
    _, path, _, _ = saved(rng, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    copy = outside / "acts.npy"
    copy.write_bytes((path / "acts.npy").read_bytes())
    return path, copy


def name_acts_file(path: pathlib.Path, file: str) -> None:
    manifest_path = path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["arrays"]["acts"]["file"] = file
    manifest_path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("where", ["parent", "absolute", "system", "subdirectory"])
def test_a_manifest_naming_a_file_outside_the_store_is_refused(rng, tmp_path, where):
    """Only plain file names inside the store's directory are opened."""
    path, copy = store_with_acts_elsewhere(rng, tmp_path)
    (path / "sub").mkdir()
    (path / "sub" / "acts.npy").write_bytes(copy.read_bytes())
    file = {
        "parent": "../outside/acts.npy",
        "absolute": str(copy.resolve()),
        "system": "/etc/passwd",
        "subdirectory": "sub/acts.npy",
    }[where]
    name_acts_file(path, file)
    with pytest.raises(ValueError) as error:
        PreferenceDataset.load(path)
    message = str(error.value)
    assert "'acts'" in message and repr(file) in message
    assert str(path) in message and "plain file name" in message


def test_a_manifest_naming_the_parent_directory_is_refused(rng, tmp_path):
    path, _ = store_with_acts_elsewhere(rng, tmp_path)
    name_acts_file(path, "..")
    with pytest.raises(ValueError, match=r"'acts'.*'\.\.'.*plain file name"):
        PreferenceDataset.load(path)


def test_a_symlinked_array_is_refused(rng, tmp_path):
    """A link is not followed, though it points to a valid copy of the array."""
    path, copy = store_with_acts_elsewhere(rng, tmp_path)
    (path / "acts.npy").unlink()
    (path / "acts.npy").symlink_to(copy)
    with pytest.raises(ValueError) as error:
        PreferenceDataset.load(path)
    message = str(error.value)
    assert "'acts'" in message and str(path / "acts.npy") in message
    assert "symbolic link" in message


def test_a_link_is_refused_by_the_open_itself(rng, tmp_path, monkeypatch):
    """A link made after any check is not followed: O_NOFOLLOW in the open."""
    path, copy = store_with_acts_elsewhere(rng, tmp_path)
    (path / "acts.npy").unlink()
    (path / "acts.npy").symlink_to(copy)
    monkeypatch.setattr(pathlib.Path, "is_symlink", lambda self: False)
    with pytest.raises(StoreError, match=r"acts\.npy.*symbolic link"):
        PreferenceDataset.load(path)


def test_an_array_that_is_not_a_regular_file_is_refused(rng, tmp_path):
    path, _ = store_with_acts_elsewhere(rng, tmp_path)
    (path / "acts.npy").unlink()
    os.mkfifo(path / "acts.npy")  # would block a plain open
    with pytest.raises(StoreError, match=r"acts\.npy.*not a regular file"):
        PreferenceDataset.load(path)


def test_a_symlinked_manifest_is_refused(rng, tmp_path):
    path, _ = store_with_acts_elsewhere(rng, tmp_path)
    moved = tmp_path / "outside" / "manifest.json"
    (path / "manifest.json").rename(moved)
    (path / "manifest.json").symlink_to(moved)
    with pytest.raises(ValueError, match=r"manifest\.json.*symbolic link"):
        PreferenceDataset.load(path)


def test_inconsistent_arrays_are_named(rng, tmp_path):
    """An index pointing outside its array, recorded consistently in the manifest."""
    dataset, path, _, _ = saved(rng, tmp_path)
    dataset._columns["obs_frames"].blocks()[0][3, 1] = 10**6
    dataset._fingerprint = None
    dataset.save(path)
    with pytest.raises(StoreError, match=r"obs_frames\.npy.*frame index outside"):
        PreferenceDataset.load(path)


def test_frames_not_matching_the_observation_space_are_named(rng, tmp_path):
    _, path, _, _ = saved(rng, tmp_path)
    loaded = PreferenceDataset.load(path)
    loaded.check_observation_space(gym.spaces.Box(0, 255, (*FRAME, STACK), np.uint8))
    with pytest.raises(ValueError, match=r"frames\.npy.*observation space"):
        loaded.check_observation_space(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8))
    with pytest.raises(ValueError, match=r"frames\.npy.*float32"):
        loaded.check_observation_space(gym.spaces.Box(0, 1, (*FRAME, STACK)))


# -- a store grown in place -----------------------------------------------------


def grown(rng, tmp_path: pathlib.Path, batches=(3, 1, 5), max_size=None):
    """A dataset pushed ``batches`` pairs at a time, each appended and committed."""
    n = sum(batches)
    pairs, prefs = make_pairs(rng, n), preferences_of(rng, n)
    dataset = PreferenceDataset(max_size=max_size)
    store = frame_store.Appender.create(tmp_path / "grown")
    manifest, done = None, 0
    for size in batches:
        dataset.push(pairs[done : done + size], prefs[done : done + size])
        done += size
        manifest = dataset.append_to(store)
        assert manifest is not None
        store.commit()
    return dataset, store, manifest, pairs, prefs


def written_bytes() -> int:
    """Bytes this process has passed to ``write`` and its kin (Linux's ``wchar``)."""
    for line in pathlib.Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def test_a_grown_store_holds_what_save_writes(rng, tmp_path):
    dataset, store, manifest, pairs, prefs = grown(rng, tmp_path)
    dataset.save(tmp_path / "whole")
    whole = frame_store.read_manifest(tmp_path / "whole")
    assert manifest["arrays"] == whole["arrays"]  # shapes, bytes, SHA-256 alike
    assert frame_store.fingerprint_of(manifest) == dataset.fingerprint()
    # The store is a frame store: load reads it, headers and manifest.json too.
    assert_same_pairs(PreferenceDataset.load(store.path), pairs, prefs)
    opened, _ = PreferenceDataset.open_committed(store.path, manifest, "record")
    assert_same_pairs(opened, pairs, prefs)
    assert opened.fingerprint() == dataset.fingerprint()


@pytest.mark.skipif(
    not pathlib.Path("/proc/self/io").exists(), reason="counts bytes with /proc"
)
def test_an_append_writes_only_the_new_pairs(rng, tmp_path):
    dataset, store, manifest, _, _ = grown(rng, tmp_path, batches=(40,))
    held = sum(entry["bytes"] for entry in manifest["arrays"].values())
    dataset.push(make_pairs(rng, 2), preferences_of(rng, 2))
    inodes = {p.name: p.stat().st_ino for p in store.path.glob("*.npy")}
    before = written_bytes()
    manifest = dataset.append_to(store)
    written = written_bytes() - before
    assert manifest is not None
    new = sum(entry["bytes"] for entry in manifest["arrays"].values()) - held
    # The new rows, eight headers and the manifest: not the 40 pairs held.
    assert new <= written < new + 16 * 1024 < held / 4
    assert {p.name: p.stat().st_ino for p in store.path.glob("*.npy")} == inodes


def test_bytes_after_the_committed_ones_are_ignored_then_cut_off(rng, tmp_path):
    dataset, store, manifest, pairs, prefs = grown(rng, tmp_path)
    # A process killed in an append: rows written, a header rewritten, no commit.
    dataset.push(make_pairs(rng, 2), preferences_of(rng, 2))
    dataset.append_to(store)
    for file in store.path.glob("*.npy"):
        with open(file, "ab") as out:
            out.write(b"\xff" * 100)
    opened, appender = PreferenceDataset.open_committed(store.path, manifest, "record")
    assert_same_pairs(opened, pairs, prefs)
    more_pairs, more_prefs = make_pairs(rng, 3), preferences_of(rng, 3)
    opened.push(more_pairs, more_prefs)
    grown_manifest = opened.append_to(appender)
    assert grown_manifest is not None
    appender.commit()
    sizes = frame_store.committed_bytes(grown_manifest)
    assert {p.name: p.stat().st_size for p in store.path.glob("*.npy")} == sizes
    everything = pairs + more_pairs, np.concatenate([prefs, more_prefs])
    assert_same_pairs(PreferenceDataset.load(store.path), *everything)
    reopened, _ = PreferenceDataset.open_committed(store.path, grown_manifest, "r")
    assert_same_pairs(reopened, *everything)


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_committed_row_is_named(rng, tmp_path, damage):
    _, store, manifest, _, _ = grown(rng, tmp_path)
    frames = store.path / "frames.npy"
    data = bytearray(frames.read_bytes())
    if damage == "flip":
        data[-7] ^= 1
        match = "SHA-256 of its first .* differs from the one record records"
    else:
        data = data[:-7]
        match = "records .* \\(truncated\\)"
    frames.write_bytes(bytes(data))
    with pytest.raises(StoreError, match=f"{frames}: .*{match}"):
        PreferenceDataset.open_committed(store.path, manifest, "record")


def test_an_evicting_dataset_cannot_grow_its_store(rng, tmp_path):
    dataset, store, _, _, _ = grown(rng, tmp_path, batches=(3, 1), max_size=4)
    dataset.push(make_pairs(rng, 1), preferences_of(rng, 1))  # evicts a pair
    files = {p.name: p.read_bytes() for p in store.path.iterdir()}
    assert dataset.append_to(store) is None
    assert {p.name: p.read_bytes() for p in store.path.iterdir()} == files
    fresh = frame_store.Appender.create(tmp_path / "fresh")
    manifest = dataset.append_to(fresh)
    assert manifest is not None and manifest["arrays"]["preferences"]["shape"] == [4]
