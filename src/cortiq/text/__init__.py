"""Text in and out of a model: tokenizer, chat templates, structured output and
tool-call parsing."""
