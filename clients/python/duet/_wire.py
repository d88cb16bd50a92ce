"""The client API's bytes (schemas/client.fbs): ClientMessage buffers with the file identifier
"DUCL", built and read with the code `flatc --python` generates at build time (duet.fb.*), exactly
as core/ipc/client.cpp builds and reads them."""

import dataclasses
from typing import List, Optional

import flatbuffers

from duet.errors import DuetError
from duet.fb.Code import Code
from duet.fb.client import (Cancel, ChatMessage, ClientMessage, CloseSession, Detokenize,
                            DetokenizeReply, Done, Error, Generate, KeepAlive, Resume,
                            SamplingParams, Status, StatusReply, TokenChunk, Tokenize,
                            TokenizeReply)
from duet.fb.client.ClientBody import ClientBody
from duet.fb.client.Priority import Priority

FILE_IDENTIFIER = b"DUCL"
PRIORITIES = {"reactive": Priority.Reactive, "proactive": Priority.Proactive}


@dataclasses.dataclass
class Stats:
    """What the frontend measured (and modelled on the stack's SoC profile) for one request."""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    queue_ms: float = 0.0
    modeled_ttft_ms: float = 0.0
    modeled_tpot_ms: float = 0.0
    flag_wait_ms: float = 0.0
    kv_bytes_copied: int = 0
    restarts_seen: int = 0
    plan: str = ""
    finish_reason: str = ""  # eos | length | stop | cancelled | error
    executed_plan: str = ""  # what ran here (auto: the solver's plan for this host)
    modeled_plan: str = ""   # what the modelled times are of (auto: the solver's plan for the SoC)


@dataclasses.dataclass
class TokenProb:
    """A token's log-probability under the model's distribution; bytes: what it adds to text."""
    id: int
    logprob: float  # NaN: none (the first prompt token of prompt_logprobs)
    bytes: bytes = b""


@dataclasses.dataclass
class TokenLogprob:
    """A token's own log-probability (chosen) and the likeliest tokens' at its position."""
    chosen: TokenProb
    top: List[TokenProb] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Chunk:
    """One streamed piece of a generation: the new token ids and the text they complete."""
    request_id: int
    ids: List[int]
    text: str
    text_bytes: int = 0  # the text's UTF-8 bytes as sent (what a Resume counts)
    logprobs: List[TokenLogprob] = dataclasses.field(default_factory=list)  # of its last ids


@dataclasses.dataclass
class Result:
    """A finished generation: its whole text and ids, and its stats; with logprobs asked for,
    those of its last len(logprobs) ids (a token generated before a frontend restart has none),
    and with prompt_logprobs one per prompt token."""
    request_id: int
    text: str
    ids: List[int]
    stats: Stats
    logprobs: List[TokenLogprob] = dataclasses.field(default_factory=list)
    prompt_logprobs: List[TokenLogprob] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Event:
    """One decoded message from the frontend; `kind` names which of the fields is set."""
    kind: str  # chunk | done | error | status | tokenize | detokenize
    request_id: int
    chunk: Optional[Chunk] = None
    done: Optional[Result] = None
    error: Optional[DuetError] = None
    value: object = None  # status: the JSON text; tokenize: (ids, pieces); detokenize: bytes


def _string(b: flatbuffers.Builder, s: Optional[str]):
    return None if s is None else b.CreateString(s)


def _int_vector(b: flatbuffers.Builder, values: List[int]):
    b.StartVector(4, len(values), 4)
    for v in reversed(values):
        b.PrependInt32(int(v))
    return b.EndVector()


def _offset_vector(b: flatbuffers.Builder, offsets: list):
    b.StartVector(4, len(offsets), 4)
    for o in reversed(offsets):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def _finish(b: flatbuffers.Builder, request_id: int, body_type: int, body) -> bytes:
    ClientMessage.Start(b)
    ClientMessage.AddRequestId(b, request_id)
    ClientMessage.AddBodyType(b, body_type)
    ClientMessage.AddBody(b, body)
    b.Finish(ClientMessage.End(b), file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())


def encode_generate(request_id: int, *, prompt: Optional[str], prompt_ids: List[int],
                    messages: List[dict], temperature: float, top_k: int, top_p: float,
                    seed: int, max_tokens: int, stop: List[str], priority: str, stream: bool,
                    plan: str, session: int, heartbeat_ms: int, ignore_eos: bool,
                    chat_template: str, parse_special: bool, model: str = "",
                    logprobs: int = -1, prompt_logprobs: bool = False) -> bytes:
    if priority not in PRIORITIES:
        raise DuetError(Code.InvalidArgument,
                        f"unknown priority '{priority}' (reactive or proactive)")
    b = flatbuffers.Builder(256)
    # Children first: flatbuffers builds back to front, and a table cannot hold an open child.
    text = _string(b, prompt) if not prompt_ids and not messages else None
    ids = _int_vector(b, prompt_ids) if prompt_ids else None
    stops = _offset_vector(b, [b.CreateString(s) for s in stop]) if stop else None
    chat = None
    if messages:
        built = []
        for m in messages:
            role, content = b.CreateString(m["role"]), b.CreateString(m["content"])
            ChatMessage.Start(b)
            ChatMessage.AddRole(b, role)
            ChatMessage.AddContent(b, content)
            built.append(ChatMessage.End(b))
        chat = _offset_vector(b, built)
    plan_s = b.CreateString(plan)
    template = _string(b, chat_template) if chat_template else None
    model_s = _string(b, model) if model else None
    SamplingParams.Start(b)
    SamplingParams.AddTemperature(b, float(temperature))
    SamplingParams.AddTopK(b, int(top_k))
    SamplingParams.AddTopP(b, float(top_p))
    SamplingParams.AddSeed(b, int(seed))
    sampling = SamplingParams.End(b)
    Generate.Start(b)
    if text is not None:
        Generate.AddPrompt(b, text)
    if ids is not None:
        Generate.AddPromptIds(b, ids)
    Generate.AddSampling(b, sampling)
    Generate.AddMaxTokens(b, int(max_tokens))
    if stops is not None:
        Generate.AddStop(b, stops)
    Generate.AddPriority(b, PRIORITIES[priority])
    Generate.AddStream(b, bool(stream))
    Generate.AddPlan(b, plan_s)
    Generate.AddSession(b, int(session))
    Generate.AddHeartbeatMs(b, int(heartbeat_ms))
    Generate.AddIgnoreEos(b, bool(ignore_eos))
    if chat is not None:
        Generate.AddMessages(b, chat)
    if template is not None:
        Generate.AddChatTemplate(b, template)
    Generate.AddParseSpecial(b, bool(parse_special))
    if model_s is not None:
        Generate.AddModel(b, model_s)
    Generate.AddLogprobs(b, int(logprobs))
    Generate.AddPromptLogprobs(b, bool(prompt_logprobs))
    return _finish(b, request_id, ClientBody.Generate, Generate.End(b))


def encode_cancel(request_id: int) -> bytes:
    b = flatbuffers.Builder(64)
    Cancel.Start(b)
    Cancel.AddRequestId(b, request_id)
    return _finish(b, request_id, ClientBody.Cancel, Cancel.End(b))


def encode_keep_alive(request_id: int) -> bytes:
    b = flatbuffers.Builder(64)
    KeepAlive.Start(b)
    KeepAlive.AddRequestId(b, request_id)
    return _finish(b, request_id, ClientBody.KeepAlive, KeepAlive.End(b))


def encode_resume(request_id: int, ids_received: int, text_bytes_received: int,
                  model: str = "") -> bytes:
    """Asks a restarted frontend for the rest of a request's stream (issue 22), on the model the
    Generate named (issue 25)."""
    b = flatbuffers.Builder(64)
    model_s = _string(b, model) if model else None
    Resume.Start(b)
    if model_s is not None:
        Resume.AddModel(b, model_s)
    Resume.AddRequestId(b, request_id)
    Resume.AddIdsReceived(b, ids_received)
    Resume.AddTextBytesReceived(b, text_bytes_received)
    return _finish(b, request_id, ClientBody.Resume, Resume.End(b))


def encode_status(request_id: int) -> bytes:
    b = flatbuffers.Builder(64)
    Status.Start(b)
    return _finish(b, request_id, ClientBody.Status, Status.End(b))


def encode_close_session(request_id: int, session: int, model: str = "") -> bytes:
    b = flatbuffers.Builder(64)
    model_s = _string(b, model) if model else None
    CloseSession.Start(b)
    if model_s is not None:
        CloseSession.AddModel(b, model_s)
    CloseSession.AddSession(b, session)
    return _finish(b, request_id, ClientBody.CloseSession, CloseSession.End(b))


def encode_tokenize(request_id: int, text: str, add_special: bool, parse_special: bool,
                    model: str = "") -> bytes:
    b = flatbuffers.Builder(64 + len(text))
    s = b.CreateString(text)
    model_s = _string(b, model) if model else None
    Tokenize.Start(b)
    if model_s is not None:
        Tokenize.AddModel(b, model_s)
    Tokenize.AddText(b, s)
    Tokenize.AddAddSpecial(b, bool(add_special))
    Tokenize.AddParseSpecial(b, bool(parse_special))
    return _finish(b, request_id, ClientBody.Tokenize, Tokenize.End(b))


def encode_detokenize(request_id: int, ids: List[int], model: str = "") -> bytes:
    b = flatbuffers.Builder(64 + 4 * len(ids))
    v = _int_vector(b, ids)
    model_s = _string(b, model) if model else None
    Detokenize.Start(b)
    if model_s is not None:
        Detokenize.AddModel(b, model_s)
    Detokenize.AddIds(b, v)
    return _finish(b, request_id, ClientBody.Detokenize, Detokenize.End(b))


def _ids(table) -> List[int]:
    return [table.Ids(i) for i in range(table.IdsLength())]


def _token_prob(p) -> TokenProb:
    raw = bytes(p.Bytes(i) for i in range(p.BytesLength()))
    return TokenProb(p.Id(), p.Logprob(), raw)


def _logprobs(table, name: str) -> List[TokenLogprob]:
    get, length = getattr(table, name), getattr(table, name + "Length")
    out = []
    for i in range(length()):
        lp = get(i)
        chosen = lp.Chosen()
        out.append(TokenLogprob(_token_prob(chosen) if chosen is not None else TokenProb(0, 0.0),
                                [_token_prob(lp.Top(k)) for k in range(lp.TopLength())]))
    return out


def _text(s: Optional[bytes]) -> str:
    return "" if s is None else s.decode("utf-8", errors="replace")


def _body(m, cls):
    t = m.Body()
    x = cls()
    x.Init(t.Bytes, t.Pos)
    return x


def decode(frame: bytes) -> Event:
    """One frame from the frontend as an Event. Python's flatbuffers has no verifier: a buffer
    that is not a ClientMessage, or whose offsets lead outside it, raises DuetError(bad_format)."""
    if len(frame) < 8 or not ClientMessage.ClientMessage.ClientMessageBufferHasIdentifier(
            frame, 0):
        raise DuetError(Code.BadFormat,
                        f"the frontend sent {len(frame)} bytes that are not a client message "
                        f"(file identifier is not {FILE_IDENTIFIER.decode()!r})")
    try:
        m = ClientMessage.ClientMessage.GetRootAs(frame, 0)
        rid, kind = m.RequestId(), m.BodyType()
        if kind == ClientBody.TokenChunk:
            c = _body(m, TokenChunk.TokenChunk)
            raw = c.Text() or b""
            return Event("chunk", rid, chunk=Chunk(rid, _ids(c), _text(raw), len(raw),
                                                   _logprobs(c, "Logprobs")))
        if kind == ClientBody.Done:
            d = _body(m, Done.Done)
            st, stats = d.Stats(), Stats()
            if st is not None:
                stats = Stats(st.PromptTokens(), st.GeneratedTokens(), st.TtftMs(), st.TpotMs(),
                              st.QueueMs(), st.ModeledTtftMs(), st.ModeledTpotMs(),
                              st.FlagWaitMs(), st.KvBytesCopied(), st.RestartsSeen(),
                              _text(st.Plan()), _text(st.FinishReason()),
                              _text(st.ExecutedPlan()), _text(st.ModeledPlan()))
            return Event("done", rid, done=Result(rid, _text(d.Text()), _ids(d), stats,
                                                  _logprobs(d, "Logprobs"),
                                                  _logprobs(d, "PromptLogprobs")))
        if kind == ClientBody.Error:
            e = _body(m, Error.Error)
            rid = e.RequestId() or rid
            return Event("error", rid, error=DuetError(e.Code(), _text(e.Message())))
        if kind == ClientBody.StatusReply:
            return Event("status", rid, value=_text(_body(m, StatusReply.StatusReply).Json()))
        if kind == ClientBody.TokenizeReply:
            r = _body(m, TokenizeReply.TokenizeReply)
            pieces = [r.Pieces(i) for i in range(r.PiecesLength())]
            return Event("tokenize", rid, value=(_ids(r), pieces))
        if kind == ClientBody.DetokenizeReply:
            return Event("detokenize", rid,
                         value=_body(m, DetokenizeReply.DetokenizeReply).Text() or b"")
    except (IndexError, ValueError, TypeError) as e:  # offsets outside the buffer
        raise DuetError(Code.BadFormat, f"the frontend sent a malformed client message: {e}") from e
    raise DuetError(Code.BadFormat, f"the frontend sent an unexpected message (ClientBody {kind})")
