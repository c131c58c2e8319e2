"""Recurrent operators: LSTM, GRU, RNN (all directions, initial states, sequence lengths).

The input projection of every time step is one GEMM over the whole sequence; each step then does
one small GEMM with the recurrence weights and the gate arithmetic. The default activations
(sigmoid/tanh) run in fused Numba cells; other activation lists use the generic path.
Steps at or past a batch entry's ``sequence_lens`` leave its state unchanged and write zeros.
"""

from __future__ import annotations

import numba
import numpy as np

from byoc.kernels.registry import NodeSpec, kernel

# -- activations ------------------------------------------------------------------------------


def _activation(name: str, alpha: float | None, beta: float | None):
    n = name.lower()
    if n == "sigmoid":
        return lambda x: 1.0 / (1.0 + np.exp(-x))
    if n == "tanh":
        return np.tanh
    if n == "relu":
        return lambda x: np.maximum(x, 0)
    if n == "affine":
        a, b = (1.0 if alpha is None else alpha), (0.0 if beta is None else beta)
        return lambda x: a * x + b
    if n == "leakyrelu":
        a = 0.01 if alpha is None else alpha
        return lambda x: np.where(x >= 0, x, a * x)
    if n == "thresholdedrelu":
        a = 1.0 if alpha is None else alpha
        return lambda x: np.where(x > a, x, 0)
    if n == "scaledtanh":
        a, b = (1.0 if alpha is None else alpha), (1.0 if beta is None else beta)
        return lambda x: a * np.tanh(b * x)
    if n == "hardsigmoid":
        a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
        return lambda x: np.clip(a * x + b, 0, 1)
    if n == "elu":
        a = 1.0 if alpha is None else alpha
        return lambda x: np.where(x >= 0, x, a * (np.exp(x) - 1))
    if n == "softsign":
        return lambda x: x / (1 + np.abs(x))
    if n == "softplus":
        return lambda x: np.log1p(np.exp(x))
    raise ValueError(f"unknown activation {name!r}")


def _activations(spec: NodeSpec, per_direction: int, defaults: list[str], n_dirs: int):
    names = list(spec.attr("activations") or []) or defaults * n_dirs
    if len(names) == per_direction and n_dirs == 2:
        names = names * 2
    if len(names) != per_direction * n_dirs:
        raise spec.error(f"expected {per_direction * n_dirs} activations, got {names}")
    alphas = list(spec.attr("activation_alpha") or [])
    betas = list(spec.attr("activation_beta") or [])
    fns = []
    for i, name in enumerate(names):
        try:
            fns.append(_activation(name, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None))
        except ValueError as exc:
            raise spec.error(str(exc)) from None
    is_default = [n.lower() for n in names] == [d.lower() for d in defaults] * n_dirs and not alphas and not betas
    return [fns[d * per_direction:(d + 1) * per_direction] for d in range(n_dirs)], is_default


# -- fused cells for the default activations --------------------------------------------------


@numba.njit(cache=True, fastmath=False)
def _lstm_cell(gates, c_prev, p, clip, input_forget, h_out, c_out):
    # gates: [batch, 4*hidden] in iofc order, already including x/h projections and biases
    batch, four_h = gates.shape
    hidden = four_h // 4
    for b in range(batch):
        for j in range(hidden):
            gi = gates[b, j] + p[0, j] * c_prev[b, j]
            gf = gates[b, 2 * hidden + j] + p[2, j] * c_prev[b, j]
            gc = gates[b, 3 * hidden + j]
            if clip > 0:
                gi = min(max(gi, -clip), clip)
                gf = min(max(gf, -clip), clip)
                gc = min(max(gc, -clip), clip)
            i = 1.0 / (1.0 + np.exp(-gi))
            f = 1.0 - i if input_forget else 1.0 / (1.0 + np.exp(-gf))
            c = f * c_prev[b, j] + i * np.tanh(gc)
            go = gates[b, hidden + j] + p[1, j] * c
            if clip > 0:
                go = min(max(go, -clip), clip)
            o = 1.0 / (1.0 + np.exp(-go))
            c_out[b, j] = c
            h_out[b, j] = o * np.tanh(c)


def _clip(x, clip):
    return np.clip(x, -clip, clip) if clip > 0 else x


def _mask_update(new, old, active):
    """Keep ``old`` rows for batch entries whose sequence has ended."""
    if active is None:
        return new
    return np.where(active[:, None], new, old)


# -- the shared driver ------------------------------------------------------------------------


class _Common:
    def __init__(self, spec: NodeSpec, n_gates: int):
        self.spec = spec
        self.hidden = int(spec.attr("hidden_size", 0) or 0)
        self.direction = spec.attr("direction", "forward")
        if self.direction not in ("forward", "reverse", "bidirectional"):
            raise spec.error(f"direction must be forward, reverse or bidirectional, got {self.direction!r}")
        self.n_dirs = 2 if self.direction == "bidirectional" else 1
        self.layout = int(spec.attr("layout", 0))
        self.clip = float(spec.attr("clip", 0.0) or 0.0)
        self.n_gates = n_gates

    def prepare(self, x, w, r, b, seq_lens, init_states):
        if self.layout == 1:
            x = np.swapaxes(x, 0, 1)
        spec = self.spec
        if x.ndim != 3 or w.ndim != 3 or r.ndim != 3:
            raise spec.error(f"X, W and R must be 3-D, got {list(x.shape)}, {list(w.shape)}, {list(r.shape)}")
        seq, batch, _ = x.shape
        hidden = self.hidden or r.shape[-1]
        g = self.n_gates
        # hidden_size is an attribute: it must agree with the weights before it sizes anything
        if tuple(r.shape) != (self.n_dirs, g * hidden, hidden) or tuple(w.shape[:2]) != (self.n_dirs, g * hidden):
            raise spec.error(f"W {list(w.shape)} and R {list(r.shape)} do not match hidden_size={hidden} with "
                             f"{g} gates and {self.n_dirs} direction(s)")
        spec.check_alloc((seq, self.n_dirs, batch, hidden), x.dtype)  # Y
        if b is None:
            b = spec.alloc.zeros((self.n_dirs, 2 * g * hidden), x.dtype)
        states = []
        for s in init_states:
            if s is None:
                s = spec.alloc.zeros((self.n_dirs, batch, hidden), x.dtype)
            elif self.layout == 1:
                s = np.swapaxes(s, 0, 1)
            states.append(s)
        lens = None if seq_lens is None else np.asarray(seq_lens).astype(np.int64)
        return x, seq, batch, hidden, b, lens, states

    def step_order(self, d: int, seq: int):
        reverse = self.direction == "reverse" or (self.direction == "bidirectional" and d == 1)
        return range(seq - 1, -1, -1) if reverse else range(seq)

    def scan(self, d: int, seq: int, lens, states: tuple, cell):
        """Run one direction: ``cell(t, *states) -> new states``; returns (Y of this direction, final states).

        Batch entries past their sequence length keep their states and write zeros to Y.
        """
        h = states[0]
        y = self.spec.alloc.zeros((seq,) + h.shape, h.dtype)
        for t in self.step_order(d, seq):
            new = cell(t, *states)
            active = _active(lens, t)
            states = tuple(_mask_update(n, o, active) for n, o in zip(new, states))
            y[t] = states[0] if active is None else np.where(active[:, None], states[0], 0)
        return y, states

    def finish(self, ys, finals, seq, batch, hidden, dtype):
        alloc = self.spec.alloc
        y = alloc.stack(ys, axis=1) if ys else alloc.zeros((seq, self.n_dirs, batch, hidden), dtype)
        outs = [y] + [alloc.stack(f, axis=0) for f in finals]
        if self.layout == 1:
            outs = [np.transpose(y, (2, 0, 1, 3))] + [np.swapaxes(o, 0, 1) for o in outs[1:]]
        return tuple(np.ascontiguousarray(o, dtype=dtype) for o in outs)


def _projection(x, w_d, bias):
    # [seq, batch, in] @ [in, G*hidden] -> [seq, batch, G*hidden], one GEMM for all steps
    seq, batch, n_in = x.shape
    return (x.reshape(seq * batch, n_in) @ w_d.T + bias).reshape(seq, batch, -1)


def _active(lens, t, reverse_len=False):
    if lens is None:
        return None
    return t < lens


@kernel("LSTM")
def make_lstm(spec: NodeSpec):
    common = _Common(spec, 4)
    acts, default = _activations(spec, 3, ["Sigmoid", "Tanh", "Tanh"], common.n_dirs)
    input_forget = bool(spec.attr("input_forget", 0))

    def run(x, w, r, b=None, seq_lens=None, h0=None, c0=None, p=None):
        x, seq, batch, hidden, b, lens, (h_init, c_init) = common.prepare(x, w, r, b, seq_lens, [h0, c0])
        dtype = x.dtype
        ys, hs, cs = [], [], []
        for d in range(common.n_dirs):
            bias = b[d, :4 * hidden] + b[d, 4 * hidden:]
            xp = _projection(x, w[d], bias)
            rt = np.ascontiguousarray(r[d].T)
            peep = spec.alloc.zeros((3, hidden), dtype) if p is None else p[d].reshape(3, hidden).astype(dtype)
            f_act, g_act, h_act = acts[d]

            def cell(t, h, c, xp=xp, rt=rt, peep=peep, f_act=f_act, g_act=g_act, h_act=h_act):
                gates = xp[t] + h @ rt
                if default:
                    h_new = spec.alloc.empty_like(h)
                    c_new = spec.alloc.empty_like(c)
                    _lstm_cell(np.ascontiguousarray(gates), np.ascontiguousarray(c), peep, common.clip,
                               input_forget, h_new, c_new)
                    return h_new, c_new
                gi, go, gf, gc = (gates[:, k * hidden:(k + 1) * hidden] for k in range(4))
                i = f_act(_clip(gi + peep[0] * c, common.clip))
                f = 1 - i if input_forget else f_act(_clip(gf + peep[2] * c, common.clip))
                c_new = f * c + i * g_act(_clip(gc, common.clip))
                o = f_act(_clip(go + peep[1] * c_new, common.clip))
                return (o * h_act(c_new)).astype(dtype), c_new.astype(dtype)

            y, (h, c) = common.scan(d, seq, lens, (h_init[d].astype(dtype), c_init[d].astype(dtype)), cell)
            ys.append(y)
            hs.append(h)
            cs.append(c)
        return common.finish(ys, [hs, cs], seq, batch, hidden, dtype)

    return run


@kernel("GRU")
def make_gru(spec: NodeSpec):
    common = _Common(spec, 3)
    acts, _ = _activations(spec, 2, ["Sigmoid", "Tanh"], common.n_dirs)
    linear_before_reset = bool(spec.attr("linear_before_reset", 0))

    def run(x, w, r, b=None, seq_lens=None, h0=None):
        x, seq, batch, hidden, b, lens, (h_init,) = common.prepare(x, w, r, b, seq_lens, [h0])
        dtype = x.dtype
        ys, hs = [], []
        for d in range(common.n_dirs):
            wb, rb = b[d, :3 * hidden], b[d, 3 * hidden:]
            xp = _projection(x, w[d], wb)
            rz, rr, rh = (np.ascontiguousarray(r[d][k * hidden:(k + 1) * hidden].T) for k in range(3))
            rbz, rbr, rbh = (rb[k * hidden:(k + 1) * hidden] for k in range(3))
            f_act, g_act = acts[d]

            def cell(t, h, xp=xp, rz=rz, rr=rr, rh=rh, rbz=rbz, rbr=rbr, rbh=rbh, f_act=f_act, g_act=g_act):
                xz, xr, xh = (xp[t][:, k * hidden:(k + 1) * hidden] for k in range(3))
                z = f_act(_clip(xz + h @ rz + rbz, common.clip))
                rg = f_act(_clip(xr + h @ rr + rbr, common.clip))
                if linear_before_reset:
                    hh = g_act(_clip(xh + rg * (h @ rh + rbh), common.clip))
                else:
                    hh = g_act(_clip(xh + (rg * h) @ rh + rbh, common.clip))
                return (((1 - z) * hh + z * h).astype(dtype),)

            y, (h,) = common.scan(d, seq, lens, (h_init[d].astype(dtype),), cell)
            ys.append(y)
            hs.append(h)
        return common.finish(ys, [hs], seq, batch, hidden, dtype)

    return run


@kernel("RNN")
def make_rnn(spec: NodeSpec):
    common = _Common(spec, 1)
    acts, _ = _activations(spec, 1, ["Tanh"], common.n_dirs)

    def run(x, w, r, b=None, seq_lens=None, h0=None):
        x, seq, batch, hidden, b, lens, (h_init,) = common.prepare(x, w, r, b, seq_lens, [h0])
        dtype = x.dtype
        ys, hs = [], []
        for d in range(common.n_dirs):
            xp = _projection(x, w[d], b[d, :hidden] + b[d, hidden:])
            rt = np.ascontiguousarray(r[d].T)
            (f_act,) = acts[d]

            def cell(t, h, xp=xp, rt=rt, f_act=f_act):
                return (f_act(_clip(xp[t] + h @ rt, common.clip)).astype(dtype),)

            y, (h,) = common.scan(d, seq, lens, (h_init[d].astype(dtype),), cell)
            ys.append(y)
            hs.append(h)
        return common.finish(ys, [hs], seq, batch, hidden, dtype)

    return run
