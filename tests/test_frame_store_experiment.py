"""Smoke tests of the frame-store experiments, ``--quick`` (figures not checked)."""

from typing import List

from tests.test_experiments import assert_made_by, read, run_script


def tables(text: str) -> List[List[List[str]]]:
    """Every Markdown table of ``text``: its rows' cells, header first."""
    found: List[List[List[str]]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                found.append([])
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if set(line.replace("|", "")) != {"-"}:
                found[-1].append(cells)
        previous = line
    return found


def test_frame_store_quick(tmp_path):
    run_script("frame_store.py", tmp_path, "--quick")
    text = read(tmp_path / "frame_store.md")
    memory, mapped, epochs = tables(text)
    assert memory[0][:4] == [
        "dataset",
        "pairs",
        "bytes/pair (arrays)",
        "bytes/pair (RssAnon slope)",
    ]
    assert [row[0] for row in memory[1:]] == ["frame store", "imitation (copies)"]
    assert all(len(row) == len(memory[0]) for row in memory)
    assert [row[0] for row in mapped if "growth" in row[0]] == [
        "growth / store size",
        "2 torchrun processes: growth / store size",
    ]
    assert [row[0] for row in epochs[-2:]] == [
        "ratio store / memory",
        "parameters bit-identical",
    ]
    assert epochs[-1][1] == "yes"
    assert_made_by(text, "frame_store.py")


def test_frame_store_verify_quick(tmp_path):
    run_script("frame_store_verify.py", tmp_path, "--quick")
    text = read(tmp_path / "frame_store_verify.md")
    (rows,) = tables(text)
    assert [row[0] for row in rows[1:3]] == [
        "`load(path, verify=False)`",
        "`load(path, verify=True)` (the default)",
    ]
    assert rows[-1][0] == "verifying, as a share of the epoch"
    assert all(float(row[1].split()[0].rstrip("%")) >= 0 for row in rows[1:3])
    assert_made_by(text, "frame_store_verify.py")
