"""vLLM's offline API, common subset (issue 36 item 2): a script written against vLLM's documented API runs
unchanged with ``vllm`` pointing at minillm; and the semantics behind it -- n, stop strings, stop_token_ids,
top_k -1/0, min_p, repetition_penalty, logprobs, chat, abort_request, text streaming -- checked against
NumPy references."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from minillm.serving import LLM, CompletionOutput, RequestOutput, SamplingParams, apply_chat_template
from minillm.tokenizer import EOS

VLLM_SCRIPT = '''
from vllm import LLM, SamplingParams

prompts = ["Hello, my name is", "The capital of France is", "def fib(n):", "import "]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, seed=0)
llm = LLM(model="tiny")
outputs = llm.generate(prompts, sampling_params)
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {generated_text!r}")
    assert output.finished and output.prompt_token_ids and output.outputs[0].token_ids
    assert output.outputs[0].finish_reason in ("stop", "length")

greedy = llm.generate(prompts, sampling_params=SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
assert [o.prompt for o in greedy] == prompts

params = [SamplingParams(n=3, temperature=1.0, top_k=-1, min_p=0.05, seed=1, max_tokens=8, logprobs=3),
          SamplingParams(temperature=0.0, max_tokens=16, stop=["\\n"], stop_token_ids=[41], repetition_penalty=1.2,
                         ignore_eos=True)]
outs = llm.generate(prompts[:2], params, use_tqdm=False)
assert [c.index for c in outs[0].outputs] == [0, 1, 2]
for c in outs[0].outputs:
    assert len(c.logprobs) == len(c.token_ids)
    assert all(t in lp for t, lp in zip(c.token_ids, c.logprobs))
    assert c.cumulative_logprob <= 0
assert "\\n" not in outs[1].outputs[0].text

token_prompt = llm.generate({"prompt_token_ids": [100, 101, 102, 32]}, SamplingParams(temperature=0, max_tokens=4))
assert token_prompt[0].prompt is None and token_prompt[0].prompt_token_ids == [100, 101, 102, 32]

conversation = [{"role": "system", "content": "You are a helpful assistant"},
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hello! How can I assist you today?"},
                {"role": "user", "content": "Write an essay about the importance of higher education."}]
chat = llm.chat(conversation, SamplingParams(temperature=0.5, max_tokens=16), use_tqdm=False)
print("Chat:", repr(chat[0].outputs[0].text))
tokenizer = llm.get_tokenizer()
assert tokenizer.decode(chat[0].outputs[0].token_ids).startswith(chat[0].outputs[0].text)
print("OK")
'''


def test_a_script_written_for_vllm_runs_unchanged(tmp_path):
    """``vllm`` is a one-line shim over minillm.serving; the script is vLLM's documented usage."""
    (tmp_path / "vllm.py").write_text("from minillm.serving import LLM, SamplingParams  # noqa: F401\n")
    (tmp_path / "script.py").write_text(VLLM_SCRIPT)
    r = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.rstrip().endswith("OK") and r.stdout.count("Prompt: ") == 4


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny")


def test_outputs_have_vllms_fields_and_the_books(llm):
    out = llm.generate(["def add(a, b):"], SamplingParams(max_tokens=6))[0]
    assert isinstance(out, RequestOutput) and isinstance(out.outputs[0], CompletionOutput)
    c = out.outputs[0]
    assert out.prompt == "def add(a, b):" and c.index == 0 and c.logprobs is None and c.cumulative_logprob is None
    assert out.token_ids == c.token_ids and out.text == c.text and out.finish_reason == c.finish_reason
    assert out.ttft >= 0 and out.e2e >= out.ttft and len(out.itl) == len(out.token_ids) - 1


def test_generate_takes_sampling_params_by_keyword_and_use_tqdm(llm):
    sp = SamplingParams(max_tokens=5)
    a = llm.generate(["x = 1"], sp, progress=False)[0].token_ids
    assert llm.generate(["x = 1"], sampling_params=sp, use_tqdm=False)[0].token_ids == a
    assert llm.generate(["x = 1"], params=sp)[0].token_ids == a                         # the book's old name
    with pytest.raises(TypeError, match="not both"):
        llm.generate(["x"], sp, use_tqdm=False, progress=False)


@pytest.mark.parametrize("off", [-1, 0, None])
def test_top_k_minus_one_and_zero_mean_off(off):
    assert SamplingParams(top_k=off).top_k is None
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)


def test_n_samples_are_the_requests_with_seeds_seed_plus_i(llm):
    sp = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    out = llm.generate(["def f(x):"], sp)[0]
    alone = [llm.generate(["def f(x):"], SamplingParams(temperature=1.0, seed=7 + i, max_tokens=10,
                                                        ignore_eos=True))[0].token_ids for i in range(3)]
    assert [c.token_ids for c in out.outputs] == alone and out.token_ids == alone[0]
    with pytest.raises(ValueError, match="n=2"):
        llm.engine.add_request("x", SamplingParams(n=2))


def test_stop_strings_cut_the_text_and_end_the_tokens(llm):
    full = llm.generate(["def f(x):"], SamplingParams(max_tokens=40, ignore_eos=True))[0]
    stop = full.text[5:7]                          # a string the greedy output contains
    cut = llm.generate(["def f(x):"], SamplingParams(max_tokens=40, ignore_eos=True, stop=[stop, "@@@"]))[0]
    c = cut.outputs[0]
    i = full.text.index(stop)
    assert c.text == full.text[:i] and c.finish_reason == "stop" and c.stop_reason == stop
    assert c.token_ids == full.token_ids[:len((full.text[:i] + stop).encode())]   # ends with the completing token
    assert "".join(llm.stream("def f(x):", SamplingParams(max_tokens=40, ignore_eos=True, stop=stop)).text()) == c.text


def test_stop_token_ids_are_the_stop_reason_and_eos_is_none(llm):
    full = llm.generate(["def f(x):"], SamplingParams(max_tokens=20, ignore_eos=True))[0]
    t = full.token_ids[3]
    c = llm.generate(["def f(x):"], SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=[t]))[0].outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == t and c.token_ids == full.token_ids[:full.token_ids.index(t) + 1]
    c = llm.generate(["def f(x):"], SamplingParams(max_tokens=400))[0].outputs[0]
    if c.token_ids[-1] == EOS:
        assert c.finish_reason == "stop" and c.stop_reason is None


def _reference_decode(model, prompt, n, penalty=1.0):
    """Greedy decoding with the repetition penalty, from full forward passes; and each step's raw log-softmax."""
    ids, lps = list(prompt), []
    for _ in range(n):
        z = model.forward(np.asarray(ids))[-1].astype(np.float64)
        lps.append(z - z.max() - np.log(np.exp(z - z.max()).sum()))
        seen = np.unique(ids)
        z[seen] = np.where(z[seen] > 0, z[seen] / penalty, z[seen] * penalty)
        ids.append(int(np.argmax(z)))
    return ids[len(prompt):], lps


def test_repetition_penalty_and_logprobs_match_a_numpy_reference(llm):
    prompt = list(b"def add(a, b):\n    return")
    want, lps = _reference_decode(llm.model, prompt, 12, penalty=1.5)
    c = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True, repetition_penalty=1.5,
                                              logprobs=2))[0].outputs[0]
    assert c.token_ids == want
    plain = llm.generate([prompt], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    assert plain != want                           # the penalty changed something
    for t, d, lp in zip(c.token_ids, c.logprobs, lps):
        top = np.argsort(-lp, kind="stable")[:2]
        assert set(d) == set(top.tolist()) | {t}
        assert d[t].logprob == pytest.approx(lp[t], abs=1e-4) and d[t].rank == int((lp > lp[t]).sum()) + 1
        assert all(d[i].logprob == pytest.approx(lp[i], abs=1e-4) for i in top)
    assert c.cumulative_logprob == pytest.approx(sum(d[t].logprob for t, d in zip(c.token_ids, c.logprobs)))


def test_min_p_one_is_greedy_and_min_p_zero_changes_nothing(llm):
    greedy = llm.generate(["import "], SamplingParams(max_tokens=12, ignore_eos=True))[0].token_ids
    hot = SamplingParams(temperature=1.5, seed=3, max_tokens=12, ignore_eos=True)
    assert llm.generate(["import "], replace(hot, min_p=1.0))[0].token_ids == greedy
    # the host path with min_p=0 (logprobs force it) samples exactly as the runner does
    assert llm.generate(["import "], replace(hot, logprobs=0))[0].token_ids == \
        llm.generate(["import "], hot)[0].token_ids


def test_host_sampling_under_speculation_and_preemption_matches_plain():
    """The penalty sees the drafts before each verified row, so speculation does not change the tokens; logprobs
    survive preemption by recompute (a pool too small for every request at once)."""
    prompts = [list(b"for i in range(10):\n    for j in range(10):\n"), list(b"x = x + 1\nx = x + 1\n")]
    sp = SamplingParams(max_tokens=24, ignore_eos=True, repetition_penalty=1.2, logprobs=1)
    plain = LLM("tiny").generate(prompts, sp)
    spec = LLM("tiny", num_speculative_tokens=3).generate(prompts, sp)
    tight = LLM("tiny", num_blocks=12, block_size=8, max_num_seqs=2).generate(prompts, sp)
    for a, b, c in zip(plain, spec, tight):
        assert a.token_ids == b.token_ids == c.token_ids
        for x, y in zip(a.outputs[0].logprobs, c.outputs[0].logprobs):
            assert {k: round(v.logprob, 4) for k, v in x.items()} == {k: round(v.logprob, 4) for k, v in y.items()}
    assert sum(o.num_preemptions for o in tight) > 0


def test_host_options_are_refused_where_nothing_computes_logits():
    llm = LLM("tiny", runner="simulated")
    with pytest.raises(ValueError, match="computes logits"):
        llm.generate([[1, 2]], SamplingParams(min_p=0.1))


def test_chat_uses_the_documented_template(llm):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    text = apply_chat_template(msgs)
    assert text == "### system:\nBe brief.\n\n### user:\nhi\n\n### assistant:\n"
    sp = SamplingParams(max_tokens=6)
    assert llm.chat(msgs, sp)[0].token_ids == llm.generate([text], sp)[0].token_ids
    assert len(llm.chat([msgs, msgs[1:]], sp)) == 2
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"role": "robot", "content": "x"}])


def test_abort_request_stops_a_stream_and_ignores_unknown_ids(llm):
    s = llm.stream("a", SamplingParams(max_tokens=200, ignore_eos=True))
    got = [next(s) for _ in range(3)]
    llm.abort_request(s.request_id)
    rest = list(s)
    assert len(got) + len(rest) < 200
    llm.abort_request([123456, s.request_id])      # unknown or finished: ignored, as in vLLM
    assert not llm.engine.requests


def test_stream_text_is_the_generated_text(llm):
    sp = SamplingParams(max_tokens=30, ignore_eos=True)
    ids = list(llm.stream("def g(", sp))           # the book's stream: token ids
    assert ids == llm.generate(["def g("], sp)[0].token_ids
    pieces = list(llm.stream("def g(", sp).text())
    assert "".join(pieces) == llm.generate(["def g("], sp)[0].text and len(pieces) > 1


def test_text_deltas_hold_back_partial_characters_and_stop_prefixes():
    from minillm.serving.outputs import TextDeltas
    d = TextDeltas(stop=("END",))
    assert d.push("abcE", False) == "ab"           # "cE" may start "END"
    assert d.push("abcEN\ufffd", False) == "c"     # a trailing U+FFFD may be half a character
    assert d.push("abcEN€", True) == "EN€"


def test_apply_chat_template_refuses_an_empty_conversation():
    """Was: [] rendered as a bare "### assistant:" prompt (OpenAI answers 400 to messages: [])."""
    with pytest.raises(ValueError, match="messages is empty"):
        apply_chat_template([])
