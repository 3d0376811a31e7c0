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


def test_loading_a_model_folder_needs_only_the_core_dependencies():
    """`pip install -e .` (no extra) loads an HF model folder: whatever components/model
    imports (its tokenizer, chat template, weights) is a core dependency (issue 49)."""
    import ast
    import re
    import sys
    distribution = {"yaml": "pyyaml"}  # module -> its distribution, where the names differ
    core = {re.split(r"[<>=!~ \[]", spec)[0].lower()
            for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    imported = set()
    for path in (ROOT / "components" / "model").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            imported |= {(n.split(".")[0], path.name) for n in names}
    missing = sorted(f"{module} ({where})" for module, where in imported
                     if module not in sys.stdlib_module_names and module != "dynarl"
                     and distribution.get(module, module).lower() not in core)
    assert not missing, f"add to [project] dependencies: {missing}"
    assert {"tokenizers", "jinja2", "safetensors"} <= core
