"""cortiq.runtime.stopping: EOS ids and stop strings, incremental over streamed pieces."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortiq.errors import ConfigError
from cortiq.runtime.stopping import StopChecker, normalize_stop, truncate_at_stop


def run(stop, pieces):
    chk = StopChecker(stop)
    emitted = []
    for p in pieces:
        emitted.append(chk.feed(p))
        if chk.stopped:
            break
    tail = chk.finish()
    return chk, emitted, tail


def test_normalize_stop():
    assert normalize_stop(None) == ()
    assert normalize_stop("x") == ("x",)
    assert normalize_stop(["a", "b", "a"]) == ("a", "b")
    with pytest.raises(ConfigError, match=r"stop\[1\]: stop strings must not be empty"):
        normalize_stop(["a", ""])
    with pytest.raises(ConfigError, match=r"stop\[0\]: expected a string"):
        normalize_stop([3])
    with pytest.raises(ConfigError, match="stop: expected a string or a list"):
        normalize_stop(5)


def test_truncate_at_stop():
    assert truncate_at_stop("hello END world", ["END"]) == ("hello ", True)
    assert truncate_at_stop("hello", ["END"]) == ("hello", False)
    assert truncate_at_stop("xbcabc", ["abc", "bc"]) == ("x", True)
    assert truncate_at_stop("anything", None) == ("anything", False)


def test_no_stop_strings_pass_through():
    chk, emitted, tail = run(None, ["a", "b<", "c"])
    assert emitted == ["a", "b<", "c"] and tail == "" and chk.text == "ab<c"
    assert not chk.stopped and chk.stop_reason is None


def test_stop_inside_one_piece():
    chk, emitted, tail = run(["END"], ["hello END world"])
    assert emitted == ["hello "] and tail == ""
    assert chk.stopped and chk.stop_reason == "stop_string" and chk.matched == "END"
    assert chk.text == "hello "
    assert chk.feed("more") == "" and chk.text == "hello "


def test_stop_string_straddling_tokens():
    chk, emitted, tail = run(["<|end|>"], ["hel", "lo <|e", "nd", "|> trailing"])
    assert emitted == ["hel", "lo ", "", ""]
    assert chk.text == "hello " and chk.stopped and tail == ""


def test_held_prefix_released_when_it_cannot_match():
    chk = StopChecker(["<|end|>"])
    assert chk.feed("a<|e") == "a" and chk.pending == "<|e"
    assert chk.feed("x") == "<|ex" and chk.pending == ""
    assert chk.feed("<") == "" and chk.pending == "<"
    assert chk.finish() == "<"                   # generation ended otherwise: release
    assert chk.text == "a<|ex<" and not chk.stopped


def test_finish_feeds_the_last_piece():
    chk = StopChecker(["STOP"])
    assert chk.feed("abc S") == "abc "
    assert chk.finish("TOP!") == ""              # the flushed piece completes the stop
    assert chk.stopped and chk.text == "abc "
    chk = StopChecker(["STOP"])
    chk.feed("abc S")
    assert chk.finish("x") == "Sx" and chk.text == "abc Sx"


def test_overlapping_stop_strings():
    # "ab" could start "abc"; "b" could start "bcd": both held, then "abc" completes first.
    chk, emitted, _ = run(["abc", "bcd"], ["xab", "cd"])
    assert emitted == ["x", ""] and chk.text == "x" and chk.matched == "abc"
    # a shorter stop string inside a longer one completes first and wins
    chk, emitted, _ = run(["abcd", "bc"], ["a", "b", "c", "d"])
    assert chk.text == "a" and chk.matched == "bc"
    # same start: the cut is the same whichever matches
    chk, _, _ = run(["ab", "abc"], ["zabc"])
    assert chk.text == "z" and chk.matched == "ab"


def test_self_overlapping_stop_string():
    chk, emitted, _ = run(["aab"], list("xaaab"))
    assert emitted == ["x", "", "", "a", ""] and chk.text == "xa" and chk.stopped


def test_unicode_stop_strings():
    chk, _, _ = run(["。\n"], ["你好", "。", "\n再见"])
    assert chk.text == "你好" and chk.stopped


def test_eos_ids():
    chk = StopChecker(["X"], eos_token_ids=[2, 7], stop_token_ids=[9])
    assert not chk.check_token(5)
    assert chk.feed("abc") == "abc"
    assert chk.check_token(9) and chk.stopped and chk.stop_reason == "eos" and chk.matched == 9
    assert chk.check_token(5)                    # stays stopped
    assert chk.feed("more") == ""
    chk = StopChecker(["STOP"], eos_token_ids=[2])
    chk.feed("text ST")
    assert chk.check_token(2)
    assert chk.finish() == "ST" and chk.text == "text ST"   # EOS: held text is released


def test_with_stream_decoder_end_to_end():
    from cortiq.text.tokenizer import Tokenizer

    tok = Tokenizer.bytes_only()
    ids = tok.encode("Grüße 🙂<|end|> never shown")
    dec, chk = tok.stream_decoder(), StopChecker(["<|end|>", "🙃"], eos_token_ids=[0])
    shown = []
    for t in ids:                                   # one byte per token: straddles a lot
        if chk.check_token(t):
            break
        shown.append(chk.feed(dec.feed(t)))
        if chk.stopped:
            break
    shown.append(chk.finish(dec.flush() if not chk.stopped else ""))
    assert "".join(shown) == chk.text == "Grüße 🙂"
    assert chk.stop_reason == "stop_string" and chk.matched == "<|end|>"


def _reference(stop, pieces):
    """Non-incremental: stop after the first piece whose cumulative text holds a stop
    string, and cut before the earliest occurrence in that text."""
    text = ""
    for p in pieces:
        text += p
        cut, found = truncate_at_stop(text, stop)
        if found:
            return cut, True
    return text, False


@given(st.lists(st.text("abc", min_size=1, max_size=4), min_size=1, max_size=3, unique=True),
       st.lists(st.text("abcx", max_size=4), max_size=12))
def test_incremental_matches_reference(stop, pieces):
    chk = StopChecker(stop)
    emitted = []
    fed = ""
    for p in pieces:
        emitted.append(chk.feed(p))
        fed += p
        if chk.stopped:
            break
        # invariants while running: emitted + held == fed; held is a possible stop prefix
        assert chk.text + chk.pending == fed
        assert chk.pending == "" or any(s.startswith(chk.pending) and s != chk.pending
                                        for s in stop)
    emitted.append(chk.finish())
    want, found = _reference(stop, pieces)
    assert "".join(emitted) == chk.text == want
    assert chk.stopped == found
    for s in stop:
        assert s not in chk.text
