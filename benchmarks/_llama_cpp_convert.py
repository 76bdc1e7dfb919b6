"""Run llama.cpp's convert_hf_to_gguf.py with the BPE pre-tokenizer pinned to "gpt-2".

Usage: python _llama_cpp_convert.py LLAMA_CPP_SRC ARGS...

The converter identifies a GPT-2-style tokenizer by hashing how it splits a fixed text and
refuses hashes it does not list; the benchmark's tiny tokenizer is not listed. Weights are
what this benchmark compares, so the pre-tokenizer name is pinned and everything else is
the converter as shipped.
"""
import os
import runpy
import sys


def main():
    src, args = sys.argv[1], sys.argv[2:]
    sys.path[:0] = [src, os.path.join(src, "gguf-py")]
    from conversion import base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = [os.path.join(src, "convert_hf_to_gguf.py"), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
