"""What every tilejit.sgl op shares: argument checks whose tilejit.Error
names the argument (where sgl-kernel has a TORCH_CHECK), the float16
refusal, the re-raise of the tilejit core's errors under the sgl op's name,
and the binding of one sgl-kernel schema version's argument list."""

import math
import numbers
import operator

import torch

from tilejit import Error


def _need(cond, msg):
    if not cond:
        raise Error(msg)


def _tensor(arg, t, op):
    """t, or a tilejit.Error "op: arg: ..." where t is not a tensor. op has
    no default: a call site without it raised without the op's name
    (fused_experts_cpu's "topk_ids.dtype=...")."""
    _need(isinstance(t, torch.Tensor),
          f"{op}: {arg}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def _opt_tensor(arg, t, op):
    return None if t is None else _tensor(arg, t, op)


def _flag(op, arg, v):
    """v, a bool argument of op (is_neox, inplace, is_vnni, renormalize,
    ...), or a tilejit.Error naming it: read by its truth value, is_neox="yes"
    ran as True and 0 / None as False. Python bools only: sglang passes
    literals and its layers' / configs' bool attributes there, never numpy or
    torch bools (its CPU call sites of every op, checked)."""
    _need(_is_bool(v), f"{op}: {arg}={_shown(v)}; allowed: True or False")
    return v


def _real(op, arg, v, allowed="a finite int or float"):
    """v as a float, a number argument of op (logit_cap, alpha, limit,
    routed_scaling_factor, ...), or a tilejit.Error naming it: float(v) read
    "x" / None as a plain ValueError / TypeError and True as 1.0. Ints and
    floats (numpy's scalars too), not bool, not a tensor: sglang's CPU call
    sites pass Python numbers from its layers and configs there, never
    tensors (checked). Finite: every such argument of the shim is a cap, a
    slope, a clamp or a scale, none of which means anything at NaN / inf.
    allowed: the message's text where the op takes more or less than that
    (None, a range); a caller taking None checks it before."""
    f = math.nan
    if isinstance(v, numbers.Real) and not _is_bool(v):
        try:
            f = float(v)
        except OverflowError:  # an int past float's range: not finite either
            pass
    _need(math.isfinite(f), f"{op}: {arg}={_shown(v)}; allowed: {allowed}")
    return f


def _int(op, arg, v, allowed="an int"):
    """v as an int, an integer argument of op (sliding_window_size,
    num_fused_shared_experts, num_expert_group, ...), or a tilejit.Error
    naming it: int(v) cut 2.5 to 2 and read True as 1, "2" as 2. An integer
    (numpy's too: :func:`_is_int`), not bool, not a float even when whole
    (2.0): sglang passes its layers' / configs' ints there, so a float is a
    caller's computation gone wrong, not a value to round."""
    _need(_is_int(v), f"{op}: {arg}={_shown(v)}; allowed: {allowed}")
    return operator.index(v)


def _shown(v):
    """v in a message: its repr, or "a <type>" where that is long (a tensor's)."""
    shown = repr(v)
    return shown if len(shown) <= 40 else f"a {type(v).__name__}"


def _no_f16(op, **tensors):
    """A tilejit.Error for any float16 tensor among tensors (sgl-kernel takes
    f16; tilejit's kernels are bf16 and nothing is converted silently)."""
    for arg, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.dtype == torch.float16:
            raise Error(f"{op}: {arg}.dtype=torch.float16 is refused (sgl-kernel takes it; "
                        "tilejit's kernels are bf16); allowed: torch.bfloat16 (convert with "
                        ".to(torch.bfloat16))")


def _core(op, note, fn, *args, **kwargs):
    """fn(*args, **kwargs); a tilejit.Error from the tilejit core comes back
    with the sgl op's name and a note mapping the core's argument names to
    sgl-kernel's."""
    try:
        return fn(*args, **kwargs)
    except Error as e:
        raise Error(f"{op}: {e} ({note})") from None


_MISSING = object()


def _bind(op, names, defaults, args, kwargs):
    """sgl-kernel's argument list names (of one schema version) bound to args
    and kwargs as Python would, with tilejit.Errors naming the op; defaults
    maps the optional names to their values. Returns a dict."""
    _need(len(args) <= len(names), f"{op}: {len(args)} positional arguments after the "
          f"fixed ones; allowed: at most {len(names)} ({', '.join(names)})")
    out = dict(zip(names, args))
    for k, v in kwargs.items():
        _need(k in names, f"{op}: unexpected keyword argument {k!r} for this schema "
              f"({', '.join(names)})")
        _need(k not in out, f"{op}: {k} given both by position and by keyword")
        out[k] = v
    for k in names:
        if k not in out:
            _need(k in defaults, f"{op}: missing argument {k}")
            out[k] = defaults[k]
    return out


def _pick_schema(op, forms, clues):
    """The sgl-kernel schema version of a call: the first key of forms (name
    -> argument list, the preferred first) that every clue fits. clues:
    (what the call did, the versions that allow it), as
    :func:`_positional_clue` and :func:`_keyword_clues` make them. Clues
    that fit no one version are an Error naming the versions the earlier
    clues left and the argument that fits none of them: bound to one
    version, a mixed call would give an argument of the other the wrong name
    (a classic sliding_window_size=-1 read as is_cross_attn, or 0 read as
    is_cross_attn=False with the window silently dropped)."""
    fit, seen = list(forms), []
    for what, allows in clues:
        left = [f for f in fit if f in allows]
        if not left:
            shown = [f for f in forms if f in fit or f in allows]
            raise Error(f"{op}: the call mixes sgl-kernel schema versions: "
                        f"{' and '.join(seen)} fit{'s' if len(seen) == 1 else ''} only "
                        f"{_versions(fit)}, {what} only {_versions(allows)}; allowed: the "
                        "arguments of one version, " + "; ".join(
                            f"{f} ({', '.join(forms[f])})" for f in shown))
        if len(left) < len(fit):
            seen.append(what)
        fit = left
    return fit[0]


def _versions(names):
    names = list(names)
    return f"the {' / '.join(names)} version{'s' if len(names) > 1 else ''}"


def _positional_clue(args, i, test, kind, yes, no):
    """[(what, versions)] for args[i], the versions yes when test(args[i])
    holds and no otherwise ([] when the call has no args[i]). kind says what
    test looks for ("a bool")."""
    if len(args) <= i:
        return []
    v, ok = args[i], test(args[i])
    shown = "a Tensor" if isinstance(v, torch.Tensor) else _shown(v)
    what = f"argument {i + 1} ({shown}{'' if ok else ', not ' + kind})"
    return [(what, yes if ok else no)]


def _keyword_clues(forms, kwargs):
    """[(what, versions)] for each keyword that only some versions of forms
    have (a name no version has is left to :func:`_bind`'s error)."""
    out = []
    for k in kwargs:
        allows = [f for f, names in forms.items() if k in names]
        if 0 < len(allows) < len(forms):
            out.append((f"keyword {k}", allows))
    return out


def _is_bool(v):
    return isinstance(v, bool)


def _is_int(v):
    """An integer that is not a bool (IntEnum included)."""
    if isinstance(v, bool) or isinstance(v, torch.Tensor):
        return False
    try:
        operator.index(v)
        return True
    except TypeError:
        return False


def _i32(arg, t, op):
    """An index tensor as int32 (tilejit's index dtype for these)."""
    _tensor(arg, t, op)
    _need(t.dtype in (torch.int32, torch.int64),
          f"{op}: {arg}.dtype={t.dtype}; allowed: torch.int32, torch.int64")
    return t if t.dtype == torch.int32 else t.to(torch.int32)
