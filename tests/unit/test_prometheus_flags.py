"""--prometheus-* flags: a URL with credentials or a query is a usage error (the token
belongs in its file), and explain answers --workload only from Prometheus."""

from __future__ import annotations

import pytest

from gpuledger.cli.explain import run_explain
from gpuledger.cli.flags import EXIT_USAGE, build_parser, prometheus_access


@pytest.mark.parametrize(
    "url",
    ["http://user:secret@prom:9090", "prom:9090", "ftp://prom", "http://prom:9090/?x=1"],
)
def test_a_url_with_credentials_or_no_http_scheme_is_refused(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["explain", "--workload", "a/b", "--prometheus-url", url])
    assert exited.value.code == EXIT_USAGE
    assert "secret" not in capsys.readouterr().err


def test_the_flags_make_the_access() -> None:
    args = build_parser().parse_args(
        [
            "explain",
            "--workload",
            "a/b",
            "--prometheus-url",
            "https://prom:9090/prefix",
            "--prometheus-bearer-token-file",
            "/t",
            "--prometheus-ca-file",
            "/ca",
            "--prometheus-server-name",
            "prom.svc",
        ]
    )
    access = prometheus_access(args)
    assert access is not None
    assert (access.url, access.bearer_token_file, access.ca_file, access.server_name) == (
        "https://prom:9090/prefix",
        "/t",
        "/ca",
        "prom.svc",
    )
    assert prometheus_access(build_parser().parse_args(["explain", "--pod", "a/b"])) is None


def test_explain_answers_only_workloads_from_prometheus(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(
        ["explain", "--pod", "a/b", "--prometheus-url", "http://127.0.0.1:1"]
    )
    assert run_explain(args) == EXIT_USAGE
    assert "--workload only" in capsys.readouterr().err


def test_an_unreachable_prometheus_is_one_line_and_exit_3(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(
        ["explain", "--workload", "a/b", "--prometheus-url", "http://127.0.0.1:1", "--timeout=2"]
    )
    assert run_explain(args) == 3
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Prometheus" in err and "(refused)" in err


@pytest.mark.parametrize("selector", ['cluster="prod"', 'cluster="a", env=~"p.*"'])
def test_a_selector_of_label_matchers_is_taken(selector: str) -> None:
    args = build_parser().parse_args(
        [
            "explain",
            "--workload",
            "a/b",
            "--prometheus-url",
            "http://p:9090",
            "--prometheus-selector",
            selector,
        ]
    )
    access = prometheus_access(args)
    assert access is not None and access.selector == selector


@pytest.mark.parametrize("selector", ["cluster=prod", '{cluster="a"}', 'a="x"} or vector(1'])
def test_a_selector_that_is_not_label_matchers_is_refused(selector: str) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(
            [
                "explain",
                "--workload",
                "a/b",
                "--prometheus-url",
                "http://p:9090",
                "--prometheus-selector",
                selector,
            ]
        )
    assert exited.value.code == EXIT_USAGE
