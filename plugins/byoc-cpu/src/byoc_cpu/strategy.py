"""How byoc-cpu runs a convolution: the one strategy chooser, for its host kernels and its code
generator alike.

Strategies (the kernels are in :mod:`byoc_cpu.host.conv` and :mod:`byoc_cpu.host.blocked`):

``pointwise``  1x1 without padding: the input is the GEMM operand.
``direct``     grouped convolutions with few channels per group (depthwise): a loop nest.
``winograd``   3x3 stride 1: Winograd F(4x4, 3x3) (or F(2x2, 3x3)) around GEMMs.
``blocked``    the channel-blocked direct kernel (input in blocks of 8 channels, register tiles).
``shift``      stride 1: one GEMM per kernel tap over the zero-padded input (no im2col).
``phase``      the same over stride-phase planes, for strided convolutions.
``im2col``     the patch matrix times the weights: everything else.

The two engines differ where their implementations do: the host runs a batch as one shift
GEMM (its padded-width waste counts every image), the code generator runs one image at a time
and reads its Winograd and phase planes with bounded padding; each has its own stem depth for
the blocked kernel. Every threshold is a value of the tuning table (:mod:`byoc_cpu.tuning`).

What the table's values stand for, as measured (one-node models and the zoo, 2 threads): with
OpenBLAS's GEMMs, Winograd F(4x4) pays from ``winograd_min_cm`` channels in x out or on planes
of ``winograd_any_cm_side`` (VGG-19), F(2x2) never; with byoc's own GEMM (AVX-512) only on big
layers (``winograd_own_gemm_*``): elsewhere shift is as fast without Winograd's transforms and
rounding. With OpenBLAS, shift (one GEMM per tap, K = channels) beats im2col's single product
from ``shift_blas_min_channels`` channels per group or with fewer than twice as many output as
input channels.
"""

from __future__ import annotations

from dataclasses import dataclass

from byoc_cpu.host import blocked
from byoc_cpu.tuning import CONV, sides

#: Winograd's kernel side: F(m x m, 3 x 3)
_WINOGRAD_KERNEL = 3

#: the strategies a user may force (``target_options={"cpu": {"conv_strategy": ...}}``), "auto" first
FORCEABLE = ("auto", "im2col", "shift", "phase", "winograd", "direct", "blocked")


@dataclass(frozen=True)
class ConvShape:
    """A convolution as the chooser sees it (2-D; 1-D has ``kh = sh = dh = 1``, ``h = oh = 1``)."""

    c: int
    m: int
    group: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    pb: int
    pr: int
    h: int
    w: int
    oh: int
    ow: int
    #: images computed together (the host runs a batch at once; the code generator one image)
    nb: int = 1
    #: spatial rank (the host's 3-D convolutions take pointwise, direct or im2col), and the
    #: depth axis of a 3-D one: kernel depth, padding before and after
    nd: int = 2
    kd: int = 1
    pd: int = 0
    #: float32 compute (the blocked, shift and phase kernels are float32-only on the host)
    float32: bool = True
    #: a BLAS or byoc GEMM exists for the compute dtype (Winograd needs one)
    gemm: bool = True
    #: byoc's own GEMM runs the per-tap products (else OpenBLAS's)
    own_gemm: bool = False
    #: byoc's own GEMM reads the taps in place (an implicit GEMM: no channel minimum for shift)
    implicit: bool = False

    @property
    def cg(self) -> int:
        return self.c // self.group

    @property
    def mg(self) -> int:
        return self.m // self.group


@dataclass(frozen=True)
class Choice:
    strategy: str
    #: the blocked kernel's output channels per weight block (``blocked`` only)
    block: int = 0
    #: the Winograd tile (``winograd`` only)
    tile: int = 0


def winograd_side(oh: int, ow: int) -> int:
    """The Winograd tile (4 or 2) for an output of ``oh x ow``, 0 where it is too small to pay."""
    side, least = min(oh, ow), sides(CONV["winograd_min_side"])
    return 4 if side >= least[4] else 2 if side >= least[2] else 0


def winograd_tile(cg: int, mg: int, oh: int, ow: int, own_gemm: bool = False) -> int:
    """The Winograd tile (4 or 2) the automatic choice takes for a 3x3 stride-1 convolution with
    ``cg`` input and ``mg`` output channels per group and an ``oh x ow`` output, 0 for none;
    ``own_gemm``: the alternative is the shift strategy on byoc's own GEMM (else OpenBLAS's)."""
    side, least = min(oh, ow), sides(CONV["winograd_min_side"])
    if cg < CONV["winograd_min_channels"] or mg < CONV["winograd_min_channels"]:
        return 0
    if own_gemm:
        own_side, own_cm = sides(CONV["winograd_own_gemm_min_side"]), sides(CONV["winograd_own_gemm_min_cm"])
        for tile in (4, 2):
            if side >= own_side[tile] and cg * mg >= own_cm[tile]:
                return tile if winograd_side(oh, ow) == tile else 0
        return 0
    if side >= least[4] and (cg * mg >= CONV["winograd_min_cm"] or side >= CONV["winograd_any_cm_side"]):
        return 4
    return 2 if side >= max(least[2], CONV["winograd_f2_min_side"]) else 0


def shift_pays(cg: int, mg: int) -> bool:
    """Whether the shift strategy beats im2col with OpenBLAS's GEMMs (one product per tap)."""
    return cg >= CONV["shift_blas_min_channels"] or mg < 2 * cg


def _waste_ok(planes_width: int, out_width: int) -> bool:
    return planes_width <= CONV["shift_max_waste"] * out_width


def _phase_planes(s: ConvShape) -> tuple[int, int]:
    return s.oh + ((s.kh - 1) * s.dh) // s.sh, s.ow + ((s.kw - 1) * s.dw) // s.sw


def _blocked(s: ConvShape, engine: str, forced: str) -> tuple[bool, int]:
    """(the blocked kernel runs this convolution where forced, the block it prefers or 0)."""
    if s.nd != 2 or not s.float32:
        return False, 0
    geo = (s.c, s.m, s.group, s.kh, s.kw, s.sh, s.sw, s.dh, s.dw)
    ok = blocked.applies(*geo) and _waste_ok(blocked.phase_extent(s.ow, s.kw, s.sw), s.ow)
    if forced != "auto":
        return ok, 0
    block = blocked.preferred(*geo, s.oh, s.ow, stem_max_depth=CONV["blocked_stem_max_depth"][engine])
    return ok, block if ok else 0


def _winograd(s: ConvShape, engine: str) -> int:
    """The Winograd tile this convolution may take (0: none)."""
    if not (s.nd == 2 and s.kh == _WINOGRAD_KERNEL and s.kw == _WINOGRAD_KERNEL and s.sh == 1 and s.sw == 1 and s.dh == 1 and s.dw == 1 and s.gemm):
        return 0
    if engine == "codegen" and (s.group != 1 or max(s.pt, s.pl, s.pb, s.pr) > 2):
        return 0  # the generated code's transform reads at most two padding rows, one group
    return winograd_side(s.oh, s.ow)


def _shift(s: ConvShape, engine: str) -> bool:
    kvol = s.kh * s.kw
    min_c = 1 if s.implicit else CONV["shift_min_channels"]
    if not (s.nd <= 2 and s.sh == 1 and s.sw == 1 and kvol > 1 and s.float32 and s.cg >= min_c):
        return False
    if not (s.implicit or shift_pays(s.cg, s.mg)):
        return False
    hp, wp = s.h + s.pt + s.pb, s.w + s.pl + s.pr
    images = s.nb if engine == "host" else 1  # the host's GEMMs run over every image's planes at once
    return _waste_ok((images - 1) * hp * wp + s.oh * wp, images * s.ow * s.oh)


def _phase(s: ConvShape, engine: str, forced: bool = False) -> bool:
    """Stride-phase planes: the host takes them for strided layers, and for stride-1 layers
    whose per-tap GEMMs do not pay on OpenBLAS; the generated code for strided layers with
    byoc's own GEMM (any, when forced), whose padding fits its planes."""
    _, wq = _phase_planes(s)
    if not (s.nd <= 2 and s.kh * s.kw > 1 and s.float32 and _waste_ok(wq, s.ow)):
        return False
    if engine == "host":
        min_c = 1 if s.implicit else CONV["shift_min_channels"]
        stride_one_shift = s.sh == 1 and s.sw == 1 and (s.implicit or shift_pays(s.cg, s.mg))
        return s.cg >= min_c and not stride_one_shift
    return ((s.sh > 1 or s.sw > 1) and (s.own_gemm or forced)
            and s.pt < s.sh * s.kh and s.pl < s.sw * s.kw)


def choose_conv(s: ConvShape, engine: str, forced: str = "auto") -> Choice:
    """How ``engine`` (``"host"`` or ``"codegen"``) runs the convolution ``s``; ``forced``: a
    strategy the user asked for (taken where it applies, else the automatic choice)."""
    blocked_ok, block = _blocked(s, engine, forced)
    tile = _winograd(s, engine)
    if forced == "winograd" and tile:
        return Choice("winograd", tile=tile)
    if forced == "blocked" and blocked_ok:
        return Choice("blocked", block=blocked.block_for(s.m))
    if forced in ("direct", "im2col"):
        return Choice(forced)
    if forced == "shift" and s.sh == 1 and s.sw == 1 and s.kh * s.kw > 1:
        return Choice("shift")
    if forced == "phase" and _phase(s, engine, forced=True):
        return Choice("phase")
    pointwise = s.kd * s.kh * s.kw == 1 and not (s.pd or s.pt or s.pl or s.pb or s.pr)
    direct = s.group > 1 and s.cg < CONV["direct_max_channels"]
    if pointwise and not block and not (direct and engine == "codegen"):
        return Choice("pointwise")
    if direct:
        return Choice("direct")
    if tile and forced == "auto" and winograd_tile(s.cg, s.mg, s.oh, s.ow, own_gemm=s.own_gemm) == tile:
        return Choice("winograd", tile=tile)
    if block:
        return Choice("blocked", block=block)
    if _shift(s, engine):
        return Choice("shift")
    if _phase(s, engine):
        return Choice("phase")
    return Choice("im2col")


__all__ = ["FORCEABLE", "Choice", "ConvShape", "choose_conv", "shift_pays", "winograd_side", "winograd_tile"]
