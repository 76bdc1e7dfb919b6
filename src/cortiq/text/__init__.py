"""Text in and out of a model: tokenizer, chat templates, structured output,
tool-call parsing and the reasoning / content split."""
