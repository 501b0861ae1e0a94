"""Secrets stay out (issue 32): values of secret-looking arguments, ``NAME=value`` words,
secret-named environment variables and URL passwords never reach a file of the run directory
(every file read, the .gz ones gunzipped) nor what doctor prints; doctor try refuses a command
whose secrets were hidden, in one line.

The tests here run no job, process nor clock (tests/unit); those that do are in
tests/e2e/test_secrets.py.
"""

from __future__ import annotations

import pytest

from doctor.job_record import recorded_env
from doctor.store.redact import (
    REDACTED,
    is_redacted,
    is_secret_name,
    redact_argv,
    redact_value,
)
from tests.support import ENV, ROOT


@pytest.mark.parametrize(("argv", "shown"), [
    (["--api-key", "X"], ["--api-key", REDACTED]),
    (["--apikey=X"], [f"--apikey={REDACTED}"]),
    (["--API_KEY", "X"], ["--API_KEY", REDACTED]),
    (["--password=Y", "--passwd", "Y"], [f"--password={REDACTED}", "--passwd", REDACTED]),
    (["--token", "Z", "--secret", "S"], ["--token", REDACTED, "--secret", REDACTED]),
    (["--key", "K", "--auth", "A", "--credentials", "C"],
     ["--key", REDACTED, "--auth", REDACTED, "--credentials", REDACTED]),
    (["--hf-token", "T", "--db_password=P", "--aws-secret-access-key", "S"],
     ["--hf-token", REDACTED, f"--db_password={REDACTED}", "--aws-secret-access-key", REDACTED]),
    (["WANDB_API_KEY=x", "db.password=y", "GH_TOKEN=z", "MY_SECRET=s", "X_PASSWORD=p"],
     [f"WANDB_API_KEY={REDACTED}", f"db.password={REDACTED}", f"GH_TOKEN={REDACTED}",
      f"MY_SECRET={REDACTED}", f"X_PASSWORD={REDACTED}"]),
    (["--url", "https://me:pw@host:8080/path", "s3://AK:SK@bucket/k", "me:pw@host"],
     ["--url", f"https://me:{REDACTED}@host:8080/path", f"s3://AK:{REDACTED}@bucket/k",
      f"me:{REDACTED}@host"]),
    (["MASTER_ADDR=me:pw@host"], [f"MASTER_ADDR=me:{REDACTED}@host"]),
    # what is not a secret stays as it is
    (["--max-tokens", "5", "--tokenizer", "gpt2", "--lr=0.1", "--keys", "a", "--monkey", "m",
      "https://host/x", "host:29500", "-m", "pkg.train", "user@host", "--token-count", "3"],
     ["--max-tokens", "5", "--tokenizer", "gpt2", "--lr=0.1", "--keys", "a", "--monkey", "m",
      "https://host/x", "host:29500", "-m", "pkg.train", "user@host", "--token-count", "3"]),
    # a model's or a dataset's settings named ...-token or ...-key are not secrets
    (["--pad-token", "<pad>", "--eos_token=</s>", "--sort-key", "length", "--dataset-key", "x"],
     ["--pad-token", "<pad>", "--eos_token=</s>", "--sort-key", "length", "--dataset-key", "x"]),
])
def test_redact_argv(argv: list[str], shown: list[str]) -> None:
    assert redact_argv(argv) == shown
    assert redact_argv(shown) == shown  # twice is once
    assert is_redacted(shown) == (shown != argv)


def test_redact_env_and_names() -> None:
    # run.json's environment (doctor.job_record): secret names left out, URL passwords hidden
    assert recorded_env(ENV) == {"MASTER_ADDR": f"me:{REDACTED}@127.0.0.1"}
    assert all(is_secret_name(k) for k in ("HF_TOKEN", "TORCH_HUB_TOKEN", "NCCL_SOCKET_PASSWORD"))
    assert not is_secret_name("TOKENIZERS_PARALLELISM") and not is_secret_name("PWD")
    assert is_secret_name("AWS_SECRET_ACCESS_KEY") and is_secret_name("--Api-Key")
    assert redact_value("plain") == "plain"


def test_the_module_runs_inside_the_job_with_the_standard_library_only() -> None:
    source = (ROOT / "doctor" / "store" / "redact.py").read_text()
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert imports == ["from __future__ import annotations", "import re",
                       "from collections.abc import Iterable"]
