"""Bad input gives one clear line on stderr and a non-zero exit, never a traceback."""

import pytest

from harness.cli.main import main


def _run(tmp_path, capsys, spec_template, **overrides):
    values = {"dataset": "cone-4", "arch": "mlp", "n0": 10, "n": 20, "alpha": 0.001,
              "method": "cohen", "sigma": 0.5} | overrides  # fmt: skip
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_template.format(**values))
    code = main(["run", str(spec), "--db", str(tmp_path / "r.sqlite"), "--quiet"])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"method": "nope"},
            "unknown method 'nope'; available: alfarra-ds, alfarra-ds-memory, ancer, ancer-memory, "
            "anisotropic-fixed, anisotropic-shifted, chen-fgss, cohen",
        ),
        (
            {"dataset": "nope"},
            "unknown dataset 'nope'; available: ball-N, cifar10, cifar100, cone-N, fashion-mnist",
        ),
        (
            {"arch": "resnet"},
            "unknown architecture 'resnet'; available: ball-N, cifar-resnet, cnn, lenet, linear-N, mlp",
        ),
        ({"alpha": 1.5}, "alpha must lie in (0, 1), got 1.5"),
        ({"alpha": 0.0}, "alpha must lie in (0, 1), got 0.0"),
        ({"n0": 50, "n": 20}, "n0 (50) must not exceed n (20)"),
        ({"n": 0, "n0": 0}, "n must be an integer >= 1, got 0"),
    ],
)
def test_invalid_spec_is_one_clear_line(tmp_path, capsys, overrides, message, spec_template):
    code, err = _run(tmp_path, capsys, spec_template, **overrides)
    assert code == 2
    assert message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("sigma", [0.0, -0.25])
def test_nonpositive_sigma_is_reported(tmp_path, capsys, sigma, spec_template):
    code, err = _run(tmp_path, capsys, spec_template, sigma=sigma)
    assert code == 2
    assert err == (
        f"error: method 'cohen', setting sigma={sigma}: sigma must be a positive number, got {sigma}"
    )


def test_unknown_setting_parameter(tmp_path, capsys, spec_template):
    spec = tmp_path / "s.toml"
    spec.write_text(spec_template.format(dataset="cone-4", arch="mlp", n0=10, n=20, alpha=0.01,
                                         method="cohen", sigma="0.5, rate = 2"))  # fmt: skip
    assert main(["run", str(spec), "--db", str(tmp_path / "r.sqlite"), "--quiet"]) == 2
    assert (
        "unknown parameter(s) ['rate'] for method 'cohen'; known: ['sigma']"
        in capsys.readouterr().err
    )


def test_malformed_toml(tmp_path, capsys):
    spec = tmp_path / "bad.toml"
    spec.write_text("[dataset\nname = 1")
    assert main(["run", str(spec), "--db", str(tmp_path / "r.sqlite")]) == 2
    err = capsys.readouterr().err
    assert "is not valid TOML" in err and "Traceback" not in err


def test_missing_spec_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "absent.toml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_missing_dataset_names_the_three_options(tmp_path, capsys, monkeypatch, spec_template):
    import plugins.datasets.fashion_mnist as fm

    monkeypatch.setattr(fm, "DEBIAN_LOCATION", tmp_path / "nowhere")
    code, err = _run(tmp_path, capsys, spec_template, dataset="fashion-mnist")
    assert code == 2
    for hint in ("--data-root", "apt-get install dataset-fashion-mnist", "--download"):
        assert hint in err


def test_results_without_database(tmp_path, capsys):
    assert main(["results", "--db", str(tmp_path / "none.sqlite")]) == 2
    assert "not found" in capsys.readouterr().err


def test_results_unknown_run(tmp_path, capsys, spec_template):
    _run(tmp_path, capsys, spec_template)
    assert main(["results", "ffff", "--db", str(tmp_path / "r.sqlite")]) == 2
    assert "no run matches 'ffff'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ('device = "tpu"', "device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
        ('seed = "a"', "seed must be an integer, got 'a'"),
        ("shard_size = 0", "shard_size must be >= 1, got 0"),
        ("radii = [-1]", "radii must be a non-empty list of numbers >= 0, got [-1]"),
    ],
)
def test_top_level_spec_values_name_what_is_expected(tmp_path, capsys, spec_template, override,
                                                     message):  # fmt: skip
    spec = tmp_path / "s.toml"
    text = spec_template.format(dataset="cone-4", arch="mlp", n0=10, n=20, alpha=0.01,
                                method="cohen", sigma=0.5)  # fmt: skip
    spec.write_text(override + "\n" + text)
    assert main(["run", str(spec), "--db", str(tmp_path / "r.sqlite"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {message}"


def test_a_missing_table_and_a_missing_file_say_what_to_do(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('name = "x"\n')
    assert main(["run", str(spec), "--quiet"]) == 2
    assert "missing table [dataset]; add it (docs/benchmarks.md" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "absent.toml"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "relative to the working directory" in err and "quick.toml" in err


@pytest.mark.parametrize("damage", ["magic", "short", "gzip"])
def test_a_damaged_dataset_file_is_named_with_the_fix(tmp_path, capsys, write_mnist, damage):
    """Fashion-MNIST's IDX files (MNIST's format) under --data-root, one of them damaged."""
    import gzip

    write_mnist(tmp_path / "data")
    root = tmp_path / "data" / "MNIST" / "raw"
    bad = root / "t10k-images-idx3-ubyte"
    raw = bad.read_bytes()
    if damage == "magic":
        bad.write_bytes(b"\x01" + raw[1:])
    elif damage == "short":
        bad.write_bytes(raw[:-100])
    else:
        bad.unlink()
        bad = root / "t10k-images-idx3-ubyte.gz"
        bad.write_bytes(gzip.compress(raw)[:-40])
    spec = tmp_path / "s.toml"
    spec.write_text(
        '[dataset]\nname = "fashion-mnist"\ntest_count = 1\n[model]\narchitecture = "mlp"\n'
        'trainer = "gaussian-augmentation"\n[[methods]]\nname = "cohen"\n'
    )
    argv = ["run", str(spec), "--data-root", str(root), "--db", str(tmp_path / "r.sqlite")]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {bad} is damaged (") and "replace it with the original" in err


OLD_PLUGIN = """
from harness import MethodSpec, hookimpl

IDRS_BENCH_CONTRACT = 2


@hookimpl
def idrs_register_methods(register):
    register(MethodSpec("my-method", sigma_provider="constant", certifier="cohen",
                        defaults={"sigma": 0.5}))
"""


def test_a_method_of_a_refused_plugin_names_the_plugin_and_why(
    tmp_path, capsys, spec_template, install_plugin
):
    """A plugin written against contract 2: its method is not 'unknown' but refused."""
    install_plugin("idrs_test_old", OLD_PLUGIN, "idrs-test-old", version="0.3", entry_point="old")
    code, err = _run(tmp_path, capsys, spec_template, method="my-method")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(
        "error: method 'my-method' is provided by plugin 'old' (package idrs-test-old 0.3), "
        "which was refused when loaded: ContractError: plugin 'old' declares "
        "IDRS_BENCH_CONTRACT = 2; this idrs-bench implements plugin contract 4 (and runs "
        "plugins of contract 3)"
    )
    assert "Porting a plugin to contract 4" in err and "unknown method" not in err


def test_a_method_of_a_plugin_that_no_longer_imports_names_it_from_the_manifest(
    tmp_path, capsys, spec_template, install_plugin, monkeypatch
):
    """A plugin that loaded once (the manifest recorded its methods), then broke."""
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))
    site = install_plugin(
        "idrs_test_old", OLD_PLUGIN.replace("= 2", "= 3"), "idrs-test-old", entry_point="old"
    )
    assert main(["plugins"]) == 0  # loads it: the manifest records 'my-method'
    capsys.readouterr()
    (site / "idrs_test_old.py").write_text("import idrs_test_missing_dependency\n")
    code, err = _run(tmp_path, capsys, spec_template, method="my-method")
    assert code == 2 and len(err.splitlines()) == 1
    assert err == (
        "error: method 'my-method' is provided by plugin 'old' (package idrs-test-old 0.1), "
        "which failed to load: ModuleNotFoundError: No module named "
        "'idrs_test_missing_dependency' (`idrs-bench plugins` lists every plugin)"
    )


def test_an_unknown_method_lists_the_plugins_that_failed_to_load(
    tmp_path, capsys, spec_template, install_plugin, monkeypatch
):
    """Never loaded, a broken plugin's methods are unknown: the error says it may hold one."""
    monkeypatch.setenv("IDRS_BENCH_CACHE", str(tmp_path / "cache"))
    install_plugin(
        "idrs_test_broken",
        "raise ImportError('needs libfoo')\n",
        "idrs-test-broken",
        entry_point="broken",
    )
    code, err = _run(tmp_path, capsys, spec_template, method="my-method")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: unknown method 'my-method'; available: alfarra-ds, ")
    assert err.endswith(
        "; plugins that were not loaded may provide it: plugin 'broken' (package "
        "idrs-test-broken 0.1) failed to load: ImportError: needs libfoo"
    )
