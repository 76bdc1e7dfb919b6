"""POST /v1/embeddings: `input` as strings or token ids; `encoding_format` float or
base64; cortiq's `pooling`: "mean" or "last"."""
from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from ..runtime.embeddings import embedding_list
from .request_models import EmbeddingRequest, parse
from .state import ServerState


async def embeddings(state: ServerState, request) -> Response:
    req = parse(EmbeddingRequest, await state.read_body(request))
    inp, fmt, pooling = req.input, req.encoding_format, req.pooling
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
