NUM_GPUS = 0

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    """`pip install .` (not editable) installs only the listed packages."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"dynarl"}
    for top in ("core", "transport", "components", "launch"):
        for init in (ROOT / top).rglob("__init__.py"):
            found.add("dynarl." + ".".join(init.parent.relative_to(ROOT).parts))
    assert found - listed == set(), f"add to pyproject.toml packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but missing: {sorted(listed - found)}"


def test_core_imports_no_launch_or_backend():
    """Dependency direction: launch -> components -> core -> transport."""
    offenders = []
    for path in list((ROOT / "core").rglob("*.py")) + list((ROOT / "transport").rglob("*.py")):
        text = path.read_text()
        for banned in ("dynarl.launch", "dynarl.components", "sglang", "megatron"):
            if f"import {banned}" in text or f"from {banned}" in text:
                offenders.append(f"{path.relative_to(ROOT)}: {banned}")
    assert not offenders, offenders


def test_no_pickle_in_the_package():
    offenders = []
    for top in ("core", "transport", "components", "launch"):
        for path in (ROOT / top).rglob("*.py"):
            for line in path.read_text().splitlines():
                stripped = line.strip()
                if stripped.startswith(("import pickle", "from pickle", "import cloudpickle", "import dill")) \
                        or "pickle.loads" in stripped or "torch.load(" in stripped:
                    offenders.append(f"{path.relative_to(ROOT)}: {stripped}")
    assert not offenders, offenders
