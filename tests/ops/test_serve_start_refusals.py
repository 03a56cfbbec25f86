"""``logbroker serve`` with a TLS certificate or a data dir it cannot use: exit 2 with one line
naming the file and what is wrong, before it listens (it was a traceback and exit 1)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, free_port, logbroker_cmd


def _serve(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        logbroker_cmd("serve", "--data-dir", str(data_dir), "--port", str(free_port()), *args),
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _certificate(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}-cert.pem", directory / f"{name}-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def pems(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("pems")
    cert, key = _certificate(directory, "gw")
    _, other_key = _certificate(directory, "other")
    return {"cert": cert, "key": key, "other_key": other_key, "missing": directory / "nope.pem"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--ssl-certfile", "missing"),
            "ssl_certfile {missing}: cannot read it: No such file or directory",
        ),
        (
            ("--ssl-certfile", "cert"),
            "ssl_certfile {cert}: holds no private key; give the certificate's key with "
            "ssl_keyfile (--ssl-keyfile)",
        ),
        (
            ("--ssl-certfile", "key", "--ssl-keyfile", "cert"),
            "ssl_certfile {key}: holds no PEM certificate (-----BEGIN CERTIFICATE-----) (it "
            "holds a private key: are the certificate and key swapped?)",
        ),
        (
            ("--ssl-certfile", "cert", "--ssl-keyfile", "other_key"),
            "ssl_keyfile {other_key}: the private key does not belong to the certificate in {cert}",
        ),
    ],
    ids=["missing", "cert-without-key", "swapped", "another-key"],
)
def test_serve_with_an_unusable_certificate_exits_2_naming_the_file(
    tmp_path: Path, pems: dict[str, Path], flags: tuple[str, ...], message: str
) -> None:
    args = [str(pems[a]) if a in pems else a for a in flags]
    done = _serve(tmp_path / "data", *args)
    assert done.returncode == 2, done.stderr
    expected = "logbroker serve: " + message.format(**{k: str(v) for k, v in pems.items()})
    assert done.stderr.strip() == expected
    assert not (tmp_path / "data").exists()


def test_serve_with_a_file_as_data_dir_exits_2_naming_it(tmp_path: Path) -> None:
    a_file = tmp_path / "store"
    a_file.write_text("not a directory\n")
    done = _serve(a_file)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"logbroker serve: data_dir {a_file} is not a directory"
    done = _serve(a_file / "below")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"logbroker serve: data_dir {a_file / 'below'}: {a_file} is not a directory"
    )
