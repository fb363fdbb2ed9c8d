"""A thin, typed layer over llama-cpp-python's low-level API.

``LlamaModel`` owns a loaded GGUF model and its vocabulary (tokenizing with a reused
buffer, token pieces cached). ``LlamaContext`` owns one llama.cpp context: its KV
cache, split into ``Slot``s (one live sequence each, its ``tokens`` mirrored position by
position, plus scratch sequences), a reusable multi-sequence batch and logits access.
Neither knows about asyncio; the backend drives them from the one llama.cpp thread
(``library.llama_thread``).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
import numpy.typing as npt
from kode.backends.defaults import CONTEXT_SIZE
from kode.backends.errors import (
    BackendClosed,
    BackendError,
    ContextOverflow,
    ModelError,
    PrefillAborted,
)
from kode.backends.kv_reuse import (
    MOVED_REFRESH,
    Held,
    MovedTail,
    choose_slot,
    common_prefix,
    plan_moved_tail,
    prefix_reach,
)
from kode.backends.llama.kv_memory import KvMemory, SavedState
from kode.backends.llama.library import init_library
from kode.backends.steppers import drain_steps, never
from kode.backends.system import usable_cores

_NO_ABORT = llama_cpp.ggml_abort_callback(0)


class LlamaModel:
    """A loaded GGUF model: weights, vocabulary and tokenizer."""

    def __init__(self, path: Path, *, vocab_only: bool = False) -> None:
        """``vocab_only``: the vocabulary and tokenizer without the weights (a window of
        the shared engine counts tokens with it)."""
        init_library()
        self.path = path
        params = llama_cpp.llama_model_default_params()
        params.use_mmap = True
        params.vocab_only = vocab_only
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise ModelError(f"llama.cpp could not load the model {path}")
        self.model = model
        self.vocab: llama_cpp.llama_vocab_p = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(model)
        desc = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(model, desc, 256)
        self.description = desc.value.decode(errors="replace")
        self._tok_buf = (llama_cpp.llama_token * 8192)()
        self._tok_lock = threading.Lock()
        self._pieces: dict[int, bytes] = {}
        self._stop = np.zeros(self.n_vocab, dtype=bool)
        for token in range(self.n_vocab):
            attr = llama_cpp.llama_vocab_get_attr(self.vocab, token)
            if llama_cpp.llama_vocab_is_eog(self.vocab, token) or (
                attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
            ):
                self._stop[token] = True

    def close(self) -> None:
        """Free the model. Safe against a tokenize or piece that is running (they hold
        ``_tok_lock``) or comes later (it raises ``BackendClosed``): a window that swaps
        its backend after a settings change may still count a line with the old one, and
        a read of freed llama.cpp memory kills the whole process."""
        with self._tok_lock:
            if self.model:
                llama_cpp.llama_model_free(self.model)
                self.model = None

    def _open_vocab(self) -> llama_cpp.llama_vocab_p:
        """The vocabulary, if the model is not closed; hold ``_tok_lock``."""
        if not self.model:
            raise BackendClosed(f"the model {self.path.name} is closed")
        return self.vocab

    def is_stop(self, token: int) -> bool:
        """End-of-generation and control tokens (FIM markers, ``<|file_sep|>``, ...)."""
        return bool(self._stop[token])

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of ``text``; ``special`` parses ``<|fim_prefix|>`` and friends."""
        data = text.encode()
        with self._tok_lock:
            vocab = self._open_vocab()
            buf = self._tok_buf
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), False, special)
            if n < 0:
                buf = (llama_cpp.llama_token * (-n))()
                n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, -n, False, special)
                if n < 0:
                    raise BackendError(f"tokenizer failed on a {len(data)}-byte text")
            return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (control tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            with self._tok_lock:
                n = llama_cpp.llama_token_to_piece(self._open_vocab(), token, buf, 64, 0, False)
            cached = buf.raw[: max(n, 0)]
            self._pieces[token] = cached
        return cached


@dataclass(frozen=True, slots=True)
class Row:
    """One batch row: a token at a KV position, visible to some sequences (their ids in
    the whole context)."""

    token: int
    pos: int
    seq_ids: tuple[int, ...] = (0,)
    logits: bool = False


class Slot:
    """One live sequence of a ``LlamaContext`` and the scratch sequences that go with it.

    Sequence ``base`` holds ``tokens``, position by position; ``base + 1`` to
    ``base + n_seq_max - 1`` are its scratch (token-tree branches, lookahead's window, the
    moved tail's inserted tokens), empty between calls. Every sequence id a ``Slot``
    method takes is relative to ``base`` (0 is the slot's own), so code written for one
    sequence runs unchanged in any slot, and nothing a slot does touches another's
    entries. A generation claims a slot for its whole life (``LlamaContext.claim``);
    what the slot holds stays when it ends, for that document's next keystroke.
    """

    def __init__(self, ctx: LlamaContext, index: int) -> None:
        self.ctx = ctx
        self.index = index
        self.base = index * ctx.n_seq_max
        self.tokens: list[int] = []  # what sequence ``base`` holds, position by position
        self.prompt_len = 0  # how many of ``tokens`` the last prefill put there
        # KV entries from here on were computed before an edit and moved (see
        # ``kv_reuse``); ``drift`` counts the edit tokens they did not see.
        self.stale_from: int | None = None
        self.drift = 0  # always 0 while stale_from is None
        self.last_move: MovedTail | None = None  # what the last prefill moved
        self.busy = False  # a generation holds it
        self.used = 0  # when it was last claimed (the context's claim count)

    def seq(self, s: int = 0) -> int:
        """The context's id of this slot's sequence ``s``."""
        return self.base + s

    # -- KV entries -------------------------------------------------------------------

    def truncate(self, n: int) -> None:
        """Drop every entry of the slot's own sequence at position >= n."""
        llama_cpp.llama_memory_seq_rm(self.ctx.mem, self.base, n, -1)
        del self.tokens[n:]
        self.prompt_len = min(self.prompt_len, n)
        if self.stale_from is not None and n <= self.stale_from:
            self.stale_from, self.drift = None, 0

    def remove(self, s: int, p0: int, p1: int = -1) -> None:
        """Drop entries of sequence ``s`` (-1: every sequence of this slot) at [p0, p1)."""
        seqs = range(self.ctx.n_seq_max) if s < 0 else (s,)
        for t in seqs:
            llama_cpp.llama_memory_seq_rm(self.ctx.mem, self.base + t, p0, p1)

    def clear(self, s: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.ctx.mem, self.base + s, -1, -1)

    def clear_scratch(self) -> None:
        for s in range(1, self.ctx.n_seq_max):
            self.clear(s)

    def copy(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        llama_cpp.llama_memory_seq_cp(self.ctx.mem, self.base + src, self.base + dst, p0, p1)

    def keep(self, s: int) -> None:
        """Leave only sequence ``s`` of this slot (``llama_memory_seq_keep`` within the
        slot: the other slots keep theirs)."""
        for t in range(self.ctx.n_seq_max):
            if t != s:
                self.clear(t)

    def pos_max(self, s: int = 0) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self.ctx.mem, self.base + s))

    # -- prompts ----------------------------------------------------------------------

    def prefill(self, tokens: Sequence[int], abort: Callable[[], bool], max_drift: int = 0) -> int:
        """``prefill_steps`` in one go."""
        return drain_steps(self.prefill_steps(tokens, abort, max_drift))

    def prefill_steps(
        self, tokens: Sequence[int], abort: Callable[[], bool], max_drift: int = 0
    ) -> Generator[None, None, int]:
        """Make the slot hold ``tokens``, reusing the longest common prefix; a generator
        that pauses between two prompt batches (another slot's generation may step
        there) and returns how many tokens were reused.

        Always evaluates at least the last token (its logits are needed), leaving them
        at row ``-1`` of the last batch, which is this slot's: it never pauses after it.
        If ``abort()`` turns true, stops early (mid-batch, through llama.cpp's abort
        callback) keeping whatever was evaluated, and raises ``PrefillAborted``. While
        another slot is busy the batches are ``n_ubatch`` rows, so that its steps wait
        at most one micro-batch (the computation is the same: llama.cpp evaluates every
        batch in micro-batches of that size).

        ``max_drift > 0`` also allows reusing the cached prompt's tail where it only
        moved (``kv_reuse.plan_moved_tail``) as long as, in all, at most ``max_drift``
        edited tokens were not seen by such moved entries; otherwise (and with
        ``max_drift == 0``) entries are reused only where they are exact.
        """
        ctx = self.ctx
        if len(tokens) >= ctx.n_ctx:
            raise ContextOverflow(f"prompt of {len(tokens)} tokens exceeds n_ctx={ctx.n_ctx}")
        self.last_move = None
        if max_drift > 0 and ctx.can_shift:
            moved = self._move_tail(tokens, max_drift)
            if moved is not None:
                return moved
        common = min(common_prefix(self.tokens, tokens), len(tokens) - 1)
        if self.stale_from is not None:
            common = min(common, self.stale_from)
        self.truncate(common)
        self.clear_scratch()
        reused = common
        pos = common
        while pos < len(tokens):
            if pos > common:
                yield
            if abort():
                raise PrefillAborted(reused)
            rows_max = ctx.n_batch if ctx.busy <= 1 else ctx.n_ubatch
            chunk = tokens[pos : pos + rows_max]
            last = pos + len(chunk) == len(tokens)
            rows = [
                Row(t, pos + i, (self.base,), last and i == len(chunk) - 1)
                for i, t in enumerate(chunk)
            ]
            try:
                ctx.decode(rows, abort)
            except BackendError:
                # Aborted mid-batch: llama.cpp keeps the micro-batches it finished.
                kept = self.pos_max() + 1
                self.tokens.extend(chunk[: max(0, kept - pos)])
                self.truncate(len(self.tokens))
                if abort():
                    raise PrefillAborted(reused) from None
                raise
            self.tokens.extend(chunk)
            pos += len(chunk)
        self.prompt_len = len(tokens)
        return reused

    def _move_tail(self, tokens: Sequence[int], max_drift: int) -> int | None:
        """Reuse the last prompt's tail at its new position, if the plan and the drift
        bound allow; returns the tokens reused, or None (nothing was changed)."""
        ctx = self.ctx
        n_old = self.prompt_len
        if n_old < 2 or len(self.tokens) < n_old or ctx.n_seq_max < 2:
            return None
        plan = plan_moved_tail(
            self.tokens[:n_old],
            tokens,
            min_tail=8,
            max_insert=min(32 + MOVED_REFRESH, ctx.n_batch - 1),
            refresh=MOVED_REFRESH,
        )
        if plan is None:
            return None
        if self.stale_from is not None and self.stale_from < plan.keep:
            return None  # the edit is past entries that are already approximate
        drift = self.drift + plan.drift  # 0 while nothing is stale
        if drift > max_drift:
            return None
        mem, own = ctx.mem, self.base
        llama_cpp.llama_memory_seq_rm(mem, own, n_old - 1, -1)  # last token, generated text
        self.clear_scratch()
        llama_cpp.llama_memory_seq_rm(mem, own, plan.keep, plan.old_tail)
        if plan.delta:
            end = plan.old_tail + plan.length
            llama_cpp.llama_memory_seq_add(mem, own, plan.old_tail, end, plan.delta)
        try:
            if plan.inserted:
                # llama.cpp wants a sequence's new positions to follow its last one, so
                # the inserted tokens go into scratch sequence 1 (sharing the prefix
                # cells) and are then shared with the slot's own as well.
                self.copy(0, 1, 0, plan.keep)
                inserted = tokens[plan.keep : plan.new_tail]
                scratch = (self.seq(1),)
                ctx.decode([Row(t, plan.keep + i, scratch, False) for i, t in enumerate(inserted)])
                self.copy(1, 0, plan.keep, plan.new_tail)
                self.clear(1)
            ctx.decode([Row(tokens[-1], len(tokens) - 1, (own,), True)])
        except BackendError:
            # Leave only what is certainly right: the untouched prefix.
            self.clear(1)
            self.truncate(plan.keep)
            raise
        self.tokens = list(tokens)
        self.prompt_len = len(tokens)
        self.stale_from, self.drift = plan.new_tail, drift
        self.last_move = plan
        return plan.keep + plan.length

    # -- saved states (KV memory) ----------------------------------------------------

    def held(self, tokens: Sequence[int]) -> Held:
        """What this slot holds, seen from a prompt of ``tokens``."""
        reach = prefix_reach(self.tokens, tokens, self.stale_from)
        return Held(reach, len(self.tokens), self.prompt_len, self.used)

    def save(self) -> None:
        """Copy the slot's own sequence into the context's KV memory."""
        ctx, memory = self.ctx.ctx, self.ctx.memory
        size = llama_cpp.llama_state_seq_get_size(ctx, self.base)
        if size <= 0 or size > memory.budget:
            return
        data = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data(ctx, data, size, self.base) != size:
            return
        memory.add(
            SavedState(list(self.tokens), self.prompt_len, self.stale_from, self.drift, data)
        )

    def restore(self, state: SavedState) -> None:
        """Make the slot hold ``state`` (on failure it holds nothing)."""
        self.truncate(0)
        self.clear_scratch()
        if (
            llama_cpp.llama_state_seq_set_data(self.ctx.ctx, state.data, state.nbytes, self.base)
            == 0
        ):
            return  # no room in the cache: start from nothing, exactly
        self.tokens = list(state.tokens)
        self.prompt_len = state.prompt_len
        self.stale_from, self.drift = state.stale_from, state.drift


class LlamaContext:
    """One llama.cpp context (KV cache + compute buffers) over a ``LlamaModel``.

    It holds ``n_slots`` live sequences (``Slot``), each with ``n_seq_max`` sequence ids
    of its own and room for ``n_ctx`` tokens: the KV cache is unified and holds
    ``n_slots * n_ctx`` cells, so several generations (one per slot) can be decoded in
    one batch, each in its own sequence, and each slot keeps what it evaluated for its
    document's next prompt. ``memory`` holds saved states of any slot.
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        n_ctx: int = CONTEXT_SIZE,
        n_batch: int = 512,
        n_seq_max: int = 1,
        n_slots: int = 1,
        n_threads: int | None = None,
        kv_memory_bytes: int = 0,
    ) -> None:
        """``n_ctx`` and ``n_seq_max`` are per slot: what one generation may use."""
        if n_slots < 1:
            raise ValueError("a context needs at least one slot")
        self.model = model
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx * n_slots
        params.n_batch = n_batch
        self.n_ubatch = min(n_batch, 128)  # an aborted prefill keeps finished micro-batches
        params.n_ubatch = self.n_ubatch
        params.n_seq_max = n_seq_max * n_slots
        params.kv_unified = True
        threads = n_threads or usable_cores()  # every core this process may use
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        ctx = llama_cpp.llama_init_from_model(model.model, params)
        if not ctx:
            raise BackendError("llama.cpp could not create a context (out of memory?)")
        self.ctx = ctx
        self.mem = llama_cpp.llama_get_memory(ctx)
        self.n_ctx: int = min(n_ctx, llama_cpp.llama_n_ctx(ctx))
        self.n_batch = n_batch
        self.n_seq_max = n_seq_max
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, n_seq_max * n_slots)
        self.can_shift = bool(llama_cpp.llama_memory_can_shift(self.mem))
        self._abort_fn: Callable[[], bool] = never
        # Called by ggml between graph nodes, only while a prefill runs (it takes the GIL).
        self._abort_cb = llama_cpp.ggml_abort_callback(lambda _data: self._abort_fn())
        self.decode_calls = 0  # every llama_decode, prefill included
        self.memory = KvMemory(kv_memory_bytes)
        self.slots = [Slot(self, i) for i in range(n_slots)]
        self._claims = 0

    def close(self) -> None:
        if self.ctx:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

    def clear_seqs(self, seqs: range) -> None:
        """Drop every entry of the sequences ``seqs`` (ids in the whole context)."""
        for seq in seqs:
            llama_cpp.llama_memory_seq_rm(self.mem, seq, -1, -1)

    # -- slots ----------------------------------------------------------------------

    @property
    def busy(self) -> int:
        """How many slots generations hold."""
        return sum(slot.busy for slot in self.slots)

    def claim(self, tokens: Sequence[int]) -> Slot:
        """A free slot for a prompt of ``tokens`` (``kv_reuse.choose_slot``): the one that
        holds most of it, unless a saved state holds more (it is restored into the slot
        that holds least); what the slot held is saved first when that is worth it."""
        free = [slot for slot in self.slots if not slot.busy]
        if not free:
            raise BackendError("every slot of the llama.cpp context is generating")
        mem = self.memory
        states = [prefix_reach(s.tokens, tokens, s.stale_from) for s in mem.states]
        choice = choose_slot([slot.held(tokens) for slot in free], states if mem.budget else [])
        slot = free[choice.slot]
        if mem.budget > 0:
            if choice.save:
                slot.save()
            if choice.state is not None:
                slot.restore(mem.take(choice.state))
        self._claims += 1
        slot.busy, slot.used = True, self._claims
        return slot

    def claim_scratch(self) -> Slot:
        """A free slot for work that leaves its own sequence alone (reading chunks into
        the store, in its scratch sequences): nothing saved or restored, and what it
        holds is no less recent for it."""
        free = [slot for slot in self.slots if not slot.busy]
        if not free:
            raise BackendError("every slot of the llama.cpp context is generating")
        slot = min(free, key=lambda s: s.used)
        slot.busy = True
        return slot

    def release(self, slot: Slot) -> None:
        """The generation holding ``slot`` ended; what it holds stays."""
        slot.clear_scratch()
        slot.busy = False

    def reach(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` would not need evaluating: the best of the slots (with
        their suffix moved, when that applies) and the saved states. An estimate: safe to
        call from another thread while this context works (it reads, never writes)."""
        best = 0
        for slot in list(self.slots):
            cached, prompt_len, stale = list(slot.tokens), slot.prompt_len, slot.stale_from
            best = max(best, prefix_reach(cached, tokens, stale))
            if self.can_shift and 2 <= prompt_len <= len(cached):
                plan = plan_moved_tail(cached[:prompt_len], tokens, refresh=MOVED_REFRESH)
                if plan is not None and (stale is None or stale >= plan.keep):
                    best = max(best, plan.keep + plan.length)
        for state in list(self.memory.states):
            best = max(best, prefix_reach(state.tokens, tokens, state.stale_from))
        return min(best, max(len(tokens) - 1, 0))

    def exact_reach(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` a slot or a saved state holds exactly (what
        ``reach`` counts without moved suffixes); safe from another thread, like it."""
        held = [prefix_reach(list(s.tokens), tokens, s.stale_from) for s in list(self.slots)]
        held += [prefix_reach(s.tokens, tokens, s.stale_from) for s in list(self.memory.states)]
        return min(max(held, default=0), max(len(tokens) - 1, 0))

    # -- evaluation -----------------------------------------------------------------

    def decode(self, rows: Sequence[Row], abort: Callable[[], bool] | None = None) -> None:
        """Evaluate one batch (at most ``n_batch`` rows); ``abort``: stop it mid-batch
        when that turns true (llama.cpp's abort callback; prompt batches)."""
        n = len(rows)
        if n > self.n_batch:
            raise BackendError(f"batch of {n} rows exceeds n_batch={self.n_batch}")
        b = self._batch
        for i, row in enumerate(rows):
            b.token[i] = row.token
            b.pos[i] = row.pos
            b.n_seq_id[i] = len(row.seq_ids)
            for j, seq in enumerate(row.seq_ids):
                b.seq_id[i][j] = seq
            b.logits[i] = row.logits
        b.n_tokens = n
        self.decode_calls += 1
        if abort is None:
            status = llama_cpp.llama_decode(self.ctx, b)
        else:
            llama_cpp.llama_set_abort_callback(self.ctx, self._abort_cb, None)
            self._abort_fn = abort
            try:
                status = llama_cpp.llama_decode(self.ctx, b)
            finally:
                self._abort_fn = never
                llama_cpp.llama_set_abort_callback(self.ctx, _NO_ABORT, None)
        if status == 1:
            raise ContextOverflow("no KV cache slot for the batch (context full)")
        if status != 0:
            raise BackendError(f"llama_decode failed with status {status}")

    def logits(self, i: int) -> npt.NDArray[np.float32]:
        """Logits of output row ``i`` of the last batch (negative counts from the end)."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
        if not ptr:
            raise BackendError(f"no logits for batch row {i}")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))
