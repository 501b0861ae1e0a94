"""The README's two commands are the ones CI and users run: keep them from drifting."""

from __future__ import annotations

import re

from tests.support import ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)[:2]


def test_readme_opens_with_setup_and_test_commands() -> None:
    run, test = readme_commands()
    assert "doctor run sample_jobs/" in run
    assert run.split(" && doctor run ")[0] in test.replace("'.[dev]'", ".")
    assert test.endswith("pytest")


def test_ci_runs_the_readme_test_command() -> None:
    _run, test = readme_commands()
    assert test in (ROOT / ".ci" / "run").read_text()


def test_the_sample_job_named_in_the_readme_exists() -> None:
    run, _test = readme_commands()
    script = run.split("doctor run ")[1].split()[0]
    assert (ROOT / script).is_file()
