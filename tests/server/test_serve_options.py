"""``tensorplug serve`` offers the options that apply to a server, and only those."""

from __future__ import annotations

import pytest

from tensorplug.cli import main
from tensorplug_llm.arch import ARCHITECTURES


def test_serve_help_lists_placement_not_a_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for shared in ("--device", "--ctx-size", "--threads", "--cache-type", "--no-repack"):
        assert shared in text
    for per_request in ("--prompt", "--tokens", "--ignore-eos", "--logits-out", "--keep"):
        assert per_request not in text
    # llama-server's: the defaults of requests that leave them out
    for default in ("--n-predict", "--temp", "--top-k", "--top-p", "--min-p"):
        assert default in text
    # every architecture the loader knows is named, not the four of an older help text
    assert all(name in text for name in ARCHITECTURES)


@pytest.mark.parametrize("option", [["-p", "hello"], ["--tokens", "1,2"]])
def test_a_per_request_option_is_a_usage_error(
    option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "x.gguf", *option])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and f" {option[0]}" in err  # -n: "ambiguous option"
