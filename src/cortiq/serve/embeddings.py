"""POST /v1/embeddings: `input` as strings or token ids; `encoding_format` float or
base64; cortiq's `pooling`: "mean" or "last"."""
from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from ..runtime.embeddings import embedding_list
from .errors import BadRequest
from .state import ServerState

MAX_EMBED_INPUTS = 2048         # OpenAI's limit on inputs per embeddings request


def _token_ids(x) -> bool:
    return isinstance(x, list) and bool(x) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in x)


def embedding_request(body) -> tuple:
    """-> (inputs: a list of strings or token-id lists, encoding format, pooling)."""
    inp = body.get("input")
    if isinstance(inp, str) or _token_ids(inp):
        inp = [inp]
    if not isinstance(inp, list) or not inp or not all(
            (isinstance(x, str) and x) or _token_ids(x) for x in inp):
        raise BadRequest("'input' must be a non-empty string, an array of them, or "
                         "token ids (an array of integers or of such arrays)", "input")
    if len(inp) > MAX_EMBED_INPUTS:
        raise BadRequest(f"'input' takes at most {MAX_EMBED_INPUTS} items", "input")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise BadRequest("'encoding_format' must be \"float\" or \"base64\"",
                         "encoding_format")
    if body.get("dimensions") is not None:
        raise BadRequest("'dimensions' is not supported by this server (embeddings have "
                         "the model's hidden size)", "dimensions",
                         code="unsupported_parameter")
    pooling = body.get("pooling", "mean")
    if pooling not in ("mean", "last"):
        raise BadRequest("'pooling' must be \"mean\" or \"last\"", "pooling")
    return inp, fmt, pooling


async def embeddings(state: ServerState, request) -> Response:
    body = await state.read_body(request)
    inp, fmt, pooling = embedding_request(body)
    state.admit()
    llm = state.llm

    def work():
        try:
            ids = [x if isinstance(x, list) else llm.tokenize(x) for x in inp]
            for i, x in enumerate(ids):
                state.check_context(len(x), f"input[{i}]", None)
            with state.gate.sem:
                return sum(map(len, ids)), llm.embed(ids, pooling=pooling)
        finally:
            state.gate.leave()
    n, vecs = await run_in_threadpool(work)
    return JSONResponse(embedding_list(vecs, n, state.model_name.id, fmt))
