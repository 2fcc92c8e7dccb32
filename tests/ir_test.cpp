// Tests of the tensor IR: types, attributes, builder type inference, printer
// golden text, parser round trips and errors, every verifier rule, and
// malformed input that must raise ParseError rather than crash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "ir/builder.h"
#include "ir/infer.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace tilejit::ir {
namespace {

using ::testing::HasSubstr;

TensorType T(DType dt, std::vector<Dim> dims, Layout l = {}) {
  return TensorType::make(dt, std::move(dims), std::move(l));
}
Dim F(int64_t v) {
  return Dim::fixed(v);
}
Dim S(const char* s) {
  return Dim::sym(s);
}

// The function of the brief: y = bf16(silu(x·wᵀ + bias)).
Function linear() {
  Builder b("linear");
  int x = b.param("x", T(DType::bf16, {S("M"), F(4096)}));
  int w = b.param("w", T(DType::bf16, {F(4096), F(4096)}, Layout::vnni2()));
  int bias = b.param("bias", T(DType::f32, {F(4096)}));
  int y = b.cast(b.unary(OpKind::silu, b.add(b.gemm(x, w), bias)), DType::bf16);
  b.ret({y});
  return b.finish();
}

constexpr const char* kLinearText =
    "func @linear(%x: tensor<?Mx4096xbf16>, %w: tensor<4096x4096xbf16, packed<vnni2, n_block=64, "
    "k_pair=2>>, %bias: tensor<4096xf32>) -> (tensor<?Mx4096xbf16>) {\n"
    "  %0 = gemm %x, %w : tensor<?Mx4096xf32>\n"
    "  %1 = add %0, %bias : tensor<?Mx4096xf32>\n"
    "  %2 = silu %1 : tensor<?Mx4096xf32>\n"
    "  %3 = cast %2 {to = bf16} : tensor<?Mx4096xbf16>\n"
    "  return %3\n"
    "}\n";

// The message verify() throws, or "" when the function is valid.
std::string verify_error(const Function& f) {
  try {
    verify(f);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
std::string verify_error(const std::string& text) {
  return verify_error(parse(text));
}
// The message of parsing and verifying `text` ("" when both succeed).
std::string parse_or_verify_error(const std::string& text) {
  try {
    return verify_error(parse(text));
  } catch (const Error& e) {
    return e.what();
  }
}

// The message infer_type throws for `kind` on operands of the given types.
std::string infer_error(OpKind kind, std::vector<std::pair<std::string, TensorType>> operands,
                        const Attrs& attrs = {}) {
  std::vector<Value> vals;
  for (size_t i = 0; i < operands.size(); ++i) {
    vals.push_back(Value{static_cast<int>(i), operands[i].first, operands[i].second});
  }
  std::vector<const Value*> ptrs;
  for (const Value& v : vals) ptrs.push_back(&v);
  try {
    infer_type(kind, ptrs, attrs);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- types ------------------------------------------------------------------

TEST(IrTypes, DimsAndTypesPrint) {
  EXPECT_EQ(F(4096).str(), "4096");
  EXPECT_EQ(S("M").str(), "?M");
  EXPECT_TRUE(F(3).is_static());
  EXPECT_FALSE(S("M").is_static());
  EXPECT_EQ(T(DType::bf16, {S("M"), F(4096)}).str(), "tensor<?Mx4096xbf16>");
  EXPECT_EQ(T(DType::f32, {}).str(), "tensor<f32>");
  EXPECT_EQ(T(DType::bf16, {F(4096), F(11008)}, Layout::vnni2()).str(),
            "tensor<4096x11008xbf16, packed<vnni2, n_block=64, k_pair=2>>");
  EXPECT_EQ(T(DType::bf16, {S("M"), F(64)}, Layout::strided({std::nullopt, 1})).str(),
            "tensor<?Mx64xbf16, strided<[?, 1]>>");
}

TEST(IrTypes, FactoriesValidate) {
  EXPECT_THROW(Dim::fixed(-1), Error);
  EXPECT_THROW(Dim::sym("3a"), Error);
  try {
    Dim::sym("max_pos");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("contains 'x', which separates dims"));
  }
  EXPECT_THROW(Layout::strided({-2}), Error);
  EXPECT_THROW(Layout::packed("vnni2", {{"n_block", 64}, {"n_block", 32}}), Error);
  // Strides must cover the rank; vnni2 is for bf16 of rank >= 2 with k_pair=2.
  EXPECT_THAT(
      [] {
        T(DType::f32, {F(4), F(4)}, Layout::strided({1}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("layout has 1 strides for rank 2")));
  EXPECT_THAT(
      [] {
        T(DType::f32, {F(4), F(4)}, Layout::vnni2());
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("does not apply to dtype f32")));
  EXPECT_THAT([] { T(DType::bf16, {F(4)}, Layout::vnni2()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("needs rank >= 2")));
  EXPECT_THAT(
      [] {
        T(DType::bf16, {F(4), F(4)}, Layout::vnni2(64, 4));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("needs k_pair=2")));
  EXPECT_THAT(
      [] {
        T(DType::bf16, {F(4), F(4)}, Layout::packed("vnni2", {{"n_block", 64}}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("needs parameter 'k_pair'")));
  EXPECT_THAT(
      [] {
        T(DType::bf16, {F(4), F(4)}, Layout::packed("tiles", {}));
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("unknown packed format 'tiles'")));
}

TEST(IrTypes, PackedParamsAreCanonical) {
  Layout a = Layout::packed("vnni2", {{"k_pair", 2}, {"n_block", 64}});
  EXPECT_EQ(a, Layout::vnni2());
  EXPECT_EQ(a.str(), "packed<vnni2, n_block=64, k_pair=2>");
  EXPECT_EQ(a.param("n_block"), 64);
  EXPECT_EQ(a.param("nope"), std::nullopt);
  EXPECT_NE(T(DType::bf16, {F(8), F(8)}), T(DType::bf16, {F(8), F(8)}, Layout::vnni2()));
}

TEST(IrTypes, DTypeNames) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i8, DType::u8, DType::i32,
                  DType::f8e4m3, DType::u4}) {
    EXPECT_EQ(dtype_from_name(dtype_name(t)), t);
  }
  EXPECT_EQ(dtype_from_name("f64"), std::nullopt);
}

// ---- ops and attributes -----------------------------------------------------------

TEST(IrOps, NamesRoundTrip) {
  for (OpKind k : all_op_kinds()) EXPECT_EQ(op_kind_from_name(name(k)), k);
  EXPECT_EQ(op_kind_from_name("conv"), std::nullopt);
  EXPECT_STREQ(name(OpKind::gelu_tanh), "gelu_tanh");
  EXPECT_EQ(operand_roles(OpKind::moe).size(), 5u);
}

TEST(IrOps, AttrsAreSortedTypedAndPrintable) {
  Attrs a{{"style", "neox"},   {"rotary_dim", 64},  {"causal", true},
          {"sm_scale", 0.125}, {"to", DType::bf16}, {"window", IntList{-1, 2}}};
  EXPECT_EQ(a.str(),
            "{causal = true, rotary_dim = 64, sm_scale = 0.125, style = \"neox\", to = bf16, "
            "window = [-1, 2]}");
  EXPECT_EQ(kind_of(*a.find("rotary_dim")), AttrKind::integer);
  EXPECT_EQ(kind_of(*a.find("style")), AttrKind::string);
  EXPECT_EQ(a.get_int("rotary_dim"), 64);
  EXPECT_EQ(a.get_double("rotary_dim"), 64.0);  // ints read as floats
  EXPECT_EQ(a.get_string("style"), "neox");
  EXPECT_EQ(a.get_bool("missing"), std::nullopt);
  EXPECT_THROW(a.get_int("style"), Error);
  EXPECT_EQ(str(AttrValue{1.0}), "1.0");  // a float stays a float in text
  EXPECT_EQ(str(AttrValue{1e-30}), "1e-30");
  EXPECT_THROW(Attrs({{"a", 1}, {"a", 2}}), Error);
  EXPECT_THROW(Attrs().set("x", std::numeric_limits<double>::infinity()), Error);
  EXPECT_EQ((Attrs{{"b", 1}, {"a", 2}}), (Attrs{{"a", 2}, {"b", 1}}));
}

// ---- builder: type inference ----------------------------------------------------

TEST(IrBuilder, InfersLinearChain) {
  Function f = linear();
  ASSERT_EQ(f.ops.size(), 4u);
  EXPECT_EQ(f.value(f.ops[0].result).type, T(DType::f32, {S("M"), F(4096)}));
  EXPECT_EQ(f.value(f.ops[1].result).type, T(DType::f32, {S("M"), F(4096)}));
  EXPECT_EQ(f.result_types(), std::vector<TensorType>{T(DType::bf16, {S("M"), F(4096)})});
  EXPECT_TRUE(check(f).empty());
  EXPECT_THROW(f.value(99), Error);
}

TEST(IrBuilder, ElementwiseBroadcastAndPromotion) {
  Builder b("ew");
  int a = b.param("a", T(DType::bf16, {S("M"), F(8)}));
  int v = b.param("v", T(DType::bf16, {F(8)}));
  int c = b.param("c", T(DType::f32, {S("M"), F(8)}));
  EXPECT_EQ(b.type(b.mul(a, v)), T(DType::bf16, {S("M"), F(8)}));  // [N] over [M, N]
  EXPECT_EQ(b.type(b.mul(v, a)), T(DType::bf16, {S("M"), F(8)}));  // either side
  EXPECT_EQ(b.type(b.add(a, c)), T(DType::f32, {S("M"), F(8)}));   // bf16 + f32 -> f32
  EXPECT_EQ(b.type(b.cast(c, DType::f16)), T(DType::f16, {S("M"), F(8)}));
  EXPECT_EQ(b.type(b.unary(OpKind::gelu_erf, c)), T(DType::f32, {S("M"), F(8)}));
  EXPECT_THAT([&] { b.unary(OpKind::add, c); },
              ::testing::ThrowsMessage<Error>(HasSubstr("add is not an activation")));
}

TEST(IrBuilder, InfersAttentionRopeMoe) {
  Builder b("layer");
  int q = b.param("q", T(DType::bf16, {S("T"), F(32), F(128)}));
  int k = b.param("k", T(DType::bf16, {S("S"), F(8), F(128)}));
  int v = b.param("v", T(DType::bf16, {S("S"), F(8), F(64)}));
  int pos = b.param("pos", T(DType::i32, {S("T")}));
  int cs = b.param("cos_sin", T(DType::f32, {S("P"), F(64)}));
  int h = b.param("h", T(DType::bf16, {S("T"), F(256)}));
  int w13 = b.param("w13", T(DType::bf16, {F(4), F(128), F(256)}, Layout::vnni2()));
  int w2 = b.param("w2", T(DType::bf16, {F(4), F(256), F(64)}, Layout::vnni2()));
  int tw = b.param("tw", T(DType::f32, {S("T"), F(2)}));
  int ti = b.param("ti", T(DType::i32, {S("T"), F(2)}));
  int qr = b.rope(q, pos, cs, {{"style", "gptj"}, {"rotary_dim", 64}});
  EXPECT_EQ(b.type(qr), b.type(q));
  int o = b.attention(qr, k, v, {{"causal", true}});
  EXPECT_EQ(b.type(o), T(DType::bf16, {S("T"), F(32), F(64)}));  // [T, Hq, Dv]
  int m = b.moe(h, w13, w2, tw, ti, {{"top_k", 2}});
  EXPECT_EQ(b.type(m), b.type(h));
  b.ret({o, m});
  Function f = b.finish();
  EXPECT_EQ(f.results.size(), 2u);
  EXPECT_THROW(b.finish(), Error);  // spent
}

TEST(IrBuilder, ErrorsNameOpOperandAndRule) {
  Builder b("bad");
  int x = b.param("x", T(DType::bf16, {S("M"), F(64)}));
  int w = b.param("w", T(DType::bf16, {F(32), F(100)}));
  EXPECT_THAT([&] { b.gemm(x, w); },
              ::testing::ThrowsMessage<Error>(
                  "gemm: operand 'w' (%w) has K=100 but 'x' (%x) has K=64: the reduction dims "
                  "must match"));
  int y = b.param("y", T(DType::f32, {S("M"), F(7)}));
  int z = b.param("z", T(DType::f32, {F(8)}));
  EXPECT_THAT([&] { b.add(y, z); },
              ::testing::ThrowsMessage<Error>(HasSubstr(
                  "add: operand 'b' (%z) has shape [8] but 'a' (%y) has shape [?M, 7]: add needs "
                  "equal shapes, or a [N] operand broadcast over [..., N]")));
  EXPECT_THROW(b.add(y, 42), Error);  // no such value
  EXPECT_EQ(infer_error(OpKind::gemm, {{"x", b.type(x)}}), "gemm: takes 2 operands (x, w), got 1");
  EXPECT_THROW(b.param("x", T(DType::f32, {})), Error);  // name taken
  b.unary(OpKind::relu, y);
  EXPECT_THAT([&] { b.param("late", T(DType::f32, {})); },
              ::testing::ThrowsMessage<Error>(HasSubstr("before the first op")));
  EXPECT_THAT([&] { b.finish(); }, ::testing::ThrowsMessage<Error>(HasSubstr("has no return")));
}

// ---- printer -------------------------------------------------------------------

TEST(IrPrinter, LinearGolden) {
  EXPECT_EQ(print(linear()), kLinearText);
}

TEST(IrPrinter, AttentionGolden) {
  Builder b("attn");
  int q = b.param("q", T(DType::bf16, {S("T"), F(32), F(128)}));
  int k =
      b.param("k", T(DType::bf16, {S("S"), F(8), F(128)}, Layout::strided({std::nullopt, 128, 1})));
  int v = b.param("v", T(DType::bf16, {S("S"), F(8), F(128)}));
  b.ret({b.attention(q, k, v,
                     {{"causal", true}, {"sm_scale", 0.08838834764831845}, {"window_left", -1}})});
  EXPECT_EQ(print(b.finish()),
            "func @attn(%q: tensor<?Tx32x128xbf16>, %k: tensor<?Sx8x128xbf16, strided<[?, 128, "
            "1]>>, %v: tensor<?Sx8x128xbf16>) -> (tensor<?Tx32x128xbf16>) {\n"
            "  %0 = attention %q, %k, %v {causal = true, sm_scale = 0.08838834764831845, "
            "window_left = -1} : tensor<?Tx32x128xbf16>\n"
            "  return %0\n"
            "}\n");
}

TEST(IrPrinter, MalformedFunctionStillPrints) {
  Function f = linear();
  f.ops[1].operands[1] = 42;
  f.results = {-3};
  std::string s = print(f);
  EXPECT_THAT(s, HasSubstr("%1 = add %0, %<id 42>"));
  EXPECT_THAT(s, HasSubstr("return %<id -3>"));
}

// ---- parser: round trips ----------------------------------------------------------

const char* const kRoundTripPrograms[] = {
    kLinearText,
    // bias only, strided x, two results
    "func @linear_bias(%x: tensor<?Mx512xbf16, strided<[?, 1]>>, %w: tensor<1000x512xbf16>, "
    "%b: tensor<1000xbf16>) -> (tensor<?Mx1000xf32>, tensor<?Mx1000xbf16>) {\n"
    "  %0 = gemm %x, %w : tensor<?Mx1000xf32>\n"
    "  %1 = add %0, %b : tensor<?Mx1000xf32>\n"
    "  %2 = cast %1 {to = bf16} : tensor<?Mx1000xbf16>\n"
    "  return %1, %2\n"
    "}\n",
    // every activation and mul
    "func @acts(%a: tensor<?Bx?Tx64xf32>, %s: tensor<64xf32>) -> (tensor<?Bx?Tx64xf32>) {\n"
    "  %0 = relu %a : tensor<?Bx?Tx64xf32>\n"
    "  %1 = silu %0 : tensor<?Bx?Tx64xf32>\n"
    "  %2 = gelu_tanh %1 : tensor<?Bx?Tx64xf32>\n"
    "  %3 = gelu_erf %2 : tensor<?Bx?Tx64xf32>\n"
    "  %4 = mul %3, %s : tensor<?Bx?Tx64xf32>\n"
    "  return %4\n"
    "}\n",
    // rope then attention, named results, every attention attribute
    "func @attn(%q: tensor<?Tx32x128xbf16>, %k: tensor<?Sx8x128xbf16>, %v: "
    "tensor<?Sx8x128xbf16>, %pos: tensor<?Txi32>, %cs: tensor<?Px64xf32>) -> "
    "(tensor<?Tx32x128xbf16>) {\n"
    "  %qr = rope %q, %pos, %cs {rotary_dim = 64, style = \"neox\"} : tensor<?Tx32x128xbf16>\n"
    "  %o = attention %qr, %k, %v {causal = true, sm_scale = 0.125, softcap = 50.0, window_left "
    "= 4096, window_right = 0} : tensor<?Tx32x128xbf16>\n"
    "  return %o\n"
    "}\n",
    // moe with packed expert weights
    "func @moe(%h: tensor<?Tx2048xbf16>, %w13: tensor<8x1536x2048xbf16, packed<vnni2, "
    "n_block=32, k_pair=2>>, %w2: tensor<8x2048x768xbf16, packed<vnni2, n_block=64, k_pair=2>>, "
    "%tw: tensor<?Tx2xf32>, %ti: tensor<?Tx2xi32>) -> (tensor<?Tx2048xbf16>) {\n"
    "  %0 = moe %h, %w13, %w2, %tw, %ti {activation = \"gelu_tanh\", top_k = 2} : "
    "tensor<?Tx2048xbf16>\n"
    "  return %0\n"
    "}\n",
    // parses although it does not verify: attrs of every kind, scalar type, odd escapes
    "func @attrs(%x: tensor<f32>) -> (tensor<f32>) {\n"
    "  %0 = relu %x {b = false, d = u4, f = -2.5e-07, i = -9223372036854775807, l = [], l2 = [1, "
    "-2, 3], s = \"a \\\"q\\\" \\\\ b\"} : tensor<f32>\n"
    "  return %0\n"
    "}\n",
};

TEST(IrParser, RoundTrips) {
  for (const char* text : kRoundTripPrograms) {
    SCOPED_TRACE(text);
    Function f = parse(text);
    EXPECT_EQ(print(f), text);  // the programs are written in printed form
    EXPECT_EQ(print(parse(print(f))), print(f));
    EXPECT_EQ(parse(print(f)), f);
  }
  for (size_t i = 0; i + 1 < std::size(kRoundTripPrograms); ++i) {
    EXPECT_EQ(verify_error(kRoundTripPrograms[i]), "") << kRoundTripPrograms[i];
  }
}

TEST(IrParser, BuilderFunctionsRoundTripStructurally) {
  Function f = linear();
  EXPECT_EQ(parse(print(f)), f);
}

TEST(IrParser, AcceptsCommentsAndFreeLayout) {
  Function f = parse(
      "// a comment\n"
      "func @f(  %x :tensor< 4xf32 , strided<[ ? ]> >)->( tensor<4xf32>){ // trailing\n"
      "%r=relu %x:tensor<4xf32>   return %r}");
  EXPECT_EQ(print(f),
            "func @f(%x: tensor<4xf32, strided<[?]>>) -> (tensor<4xf32>) {\n"
            "  %r = relu %x : tensor<4xf32>\n"
            "  return %r\n"
            "}\n");
  EXPECT_EQ(verify_error(f), "");
}

// ---- parser: errors at exact positions -------------------------------------------

struct ErrorCase {
  const char* text;
  int line;
  int col;
  const char* message;
};

TEST(IrParser, ErrorsCarryLineAndColumn) {
  const ErrorCase cases[] = {
      {"func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {\n  %0 = frob %x : tensor<4xf32>\n"
       "  return %0\n}\n",
       2, 8, "unknown op 'frob'"},
      {"func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {\n  %0 = relu %y : tensor<4xf32>\n"
       "  return %0\n}\n",
       2, 13, "use of undefined value %y"},
      {"func @f(%x: tensor<4xq7>) -> () {\n  return\n}\n", 1, 22, "unknown dtype 'q7'"},
      {"func @f(%x: tensor<4 4xf32>) -> () {\n  return\n}\n", 1, 21, "expected 'x' after a dim"},
      {"func @f(%x: tensor<4xf32>, %x: tensor<4xf32>) -> () {\n  return\n}\n", 1, 28,
       "redefinition of %x (first defined at 1:9)"},
      {"func @f(%x: tensor<4xf32>) -> (tensor<4xbf16>) {\n  return %x\n}\n", 1, 32,
       "result 0 is declared tensor<4xbf16> but the returned %x is tensor<4xf32>"},
      {"func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {\n  return %x, %x\n}\n", 2, 3,
       "return gives 2 value(s) but @f declares 1 result(s)"},
      {"func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {\n  %0 = relu %x {s = \"abc\n", 2, 21,
       "unterminated string"},
      {"func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {\n  %0 = relu %x {s = neox} : "
       "tensor<4xf32>\n  return %0\n}\n",
       2, 21, "unknown attribute value 'neox' (strings are quoted: \"neox\")"},
      {"func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {\n  return %x\n}\n}", 4, 1,
       "expected end of input after '}', got '}'"},
      {"func @f(%x: tensor<4x4xf32, packed<blocky>>) -> () {\n  return\n}\n", 1, 13,
       "unknown packed format 'blocky'"},
      {"func @f(%x: tensor<4x4xf32, strided<[1]>>) -> () {\n  return\n}\n", 1, 13,
       "layout has 1 strides for rank 2"},
      {"func @f(%x: tensor<4x4xf32, tiled<1>>) -> () {\n  return\n}\n", 1, 29,
       "unknown layout 'tiled'"},
      {"func @f(%x: tensor<99999999999999999999xf32>) -> () {\n  return\n}\n", 1, 20,
       "out of range"},
      {"func @f(%x: tensor<?max_posx4xf32>) -> () {\n  return\n}\n", 1, 24,
       "dim symbols end at the first 'x'"},
      {"", 1, 1, "expected 'func', got end of input"},
  };
  for (const ErrorCase& c : cases) {
    SCOPED_TRACE(c.text);
    try {
      parse(c.text, "t.tir");
      ADD_FAILURE() << "no error";
    } catch (const ParseError& e) {
      EXPECT_EQ(e.line(), c.line);
      EXPECT_EQ(e.col(), c.col);
      EXPECT_THAT(e.detail(), HasSubstr(c.message));
      EXPECT_EQ(std::string(e.what()), std::string("t.tir:") + std::to_string(c.line) + ":" +
                                           std::to_string(c.col) + ": error: " + e.detail());
      EXPECT_EQ(e.file(), "t.tir");
    }
  }
}

// ---- parser: malformed input never crashes -------------------------------------------

// Parses `text`; any outcome but success or ParseError is a failure.
void parse_or_parse_error(const std::string& text) {
  try {
    parse(text);
  } catch (const ParseError&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-ParseError exception " << e.what() << " on:\n" << text;
  }
}

TEST(IrParser, MalformedInputThrowsParseError) {
  const std::string bad[] = {
      "func",
      "func @",
      "func @f(",
      "func @f() -> () {",
      "}}}}",
      std::string("func @f(\0) -> () { return }", 27),
      "\xff\xfe func",
      "func @f(%: tensor<f32>) -> () { return }",
      "func @f(%x: tensor<?xf32>) -> () { return }",
      "func @f(%x: tensor<4x>) -> () { return }",
      "func @f(%x: tensor<4xf32, packed<vnni2, n_block=>>) -> () { return }",
      "func @f(%x: tensor<4xf32, strided<[--1]>>) -> () { return }",
      "func @f(%x: tensor<f32>) -> (tensor<f32>) { %0 = relu %x {a = 1e99999} : tensor<f32> "
      "return %0 }",
      "func @f(%x: tensor<f32>) -> (tensor<f32>) { %0 = relu %x {a = [1, x]} : tensor<f32> "
      "return %0 }",
      "func @f(%x: tensor<f32>) -> (tensor<f32>) { %0 = relu %x {a = 1, a = 2} : tensor<f32> "
      "return %0 }",
      "func @f(%x: tensor<f32>) -> (tensor<f32>) { %0 = relu %x {a = \"\\n\"} : tensor<f32> "
      "return %0 }",
      "func @f(%x: tensor<f32>) -> (tensor<f32>) { %0 = relu %x : tensor<f32> return %0 } extra",
      "func @f() -> () { %0 = relu %0 : tensor<f32> return }",
  };
  for (const std::string& s : bad) {
    SCOPED_TRACE(s);
    EXPECT_THROW(parse(s), ParseError);
  }
  // Every proper prefix of a valid program is an error.
  const std::string text = kLinearText;
  for (size_t n = 0; n + 2 < text.size(); ++n) {
    SCOPED_TRACE(n);
    EXPECT_THROW(parse(text.substr(0, n)), ParseError);
  }
  // Random byte edits either parse or raise ParseError.
  std::mt19937 rng(1234);
  const std::string alphabet = "%@<>{}[](),:=?x-.\"\\ \n0123456789abcdefgijklmnopqrstuvwz\x01\x80";
  for (int i = 0; i < 3000; ++i) {
    std::string s = kRoundTripPrograms[i % std::size(kRoundTripPrograms)];
    for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
      size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          s.erase(at, 1 + rng() % 4);
          break;
        default:
          s.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
      }
      if (s.empty()) s.push_back('x');
    }
    parse_or_parse_error(s);
  }
}

// ---- verifier: one test per rule ---------------------------------------------------

// A gemm program with the given x and w types and result type.
std::string gemm_text(const std::string& x, const std::string& w, const std::string& r) {
  return "func @g(%x: " + x + ", %w: " + w + ") -> (" + r + ") {\n  %0 = gemm %x, %w : " + r +
         "\n  return %0\n}\n";
}

TEST(IrVerifier, Structure) {
  Function f = linear();
  std::swap(f.ops[0], f.ops[1]);  // add before the gemm that defines its operand
  EXPECT_THAT(verify_error(f),
              HasSubstr("%1 = add: operand 'a' (%0) is used before it is defined"));

  f = linear();
  f.ops[2].result = f.ops[1].result;
  EXPECT_THAT(verify_error(f), HasSubstr("%1 = silu: redefines %1 (each value is defined once)"));

  f = linear();
  f.results = {17};
  EXPECT_THAT(verify_error(f), HasSubstr("return: id 17 is not a value"));

  f = linear();
  f.results = {};
  EXPECT_THAT(verify_error(f), HasSubstr("function @linear returns nothing"));

  f = linear();
  f.values[3].name = "x";
  EXPECT_THAT(verify_error(f), HasSubstr("value %x is named twice (ids 0 and 3)"));

  f = linear();
  f.ops.pop_back();  // %3 is returned but no longer defined
  EXPECT_THAT(verify_error(f), HasSubstr("return: %3 is not defined"));

  f = linear();
  f.ops[0].operands.push_back(2);
  EXPECT_THAT(verify_error(f), HasSubstr("%0 = gemm: takes 2 operands (x, w), got 3"));
}

TEST(IrVerifier, ValueTypesAreWellFormed) {
  Function f = linear();
  f.values[0].type.layout.strides = {1};  // rank 2, one stride
  EXPECT_THAT(verify_error(f),
              HasSubstr("value %x: tensor<?Mx4096xbf16, strided<[1]>>: layout has 1 strides "
                        "for rank 2"));
  f = linear();
  f.values[1].type.layout.format = "q4_0";
  EXPECT_THAT(verify_error(f), HasSubstr("value %w: "));
  EXPECT_THAT(verify_error(f), HasSubstr("unknown packed format 'q4_0'"));
}

// Strides that give two elements one address are refused where the type is
// written: the tool would lay a dense input file into them and drop values
// (x strided<[3, 1]> with K 64 ran as the dense program, silently).
TEST(IrVerifier, OverlappingStridesAreRefused) {
  const std::string r = "tensor<?Mx32xf32>";
  EXPECT_THAT(parse_or_verify_error(
                  gemm_text("tensor<?Mx64xbf16, strided<[3, 1]>>", "tensor<32x64xbf16>", r)),
              HasSubstr("strides strided<[3, 1]> overlap: dim 0's stride 3 is less than the 64 × 1 "
                        "elements dim 1 spans"));
  EXPECT_THAT(parse_or_verify_error(
                  gemm_text("tensor<4x64xbf16, strided<[0, 1]>>", "tensor<32x64xbf16>", r)),
              HasSubstr("stride 0 on dim 0 of extent 4 gives its elements one address"));
  // Allowed: rows wider than K, a dim of 1 with any stride, a dynamic stride,
  // the transposed [K, N] form of an f8e4m3 weight, padded inner dims.
  EXPECT_EQ(parse_or_verify_error(
                gemm_text("tensor<?Mx64xbf16, strided<[64, 1]>>", "tensor<32x64xbf16>", r)),
            "");
  EXPECT_EQ(parse_or_verify_error(gemm_text("tensor<1x64xbf16, strided<[0, 1]>>",
                                            "tensor<32x64xbf16>", "tensor<1x32xf32>")),
            "");
  EXPECT_EQ(parse_or_verify_error(
                gemm_text("tensor<?Mx64xbf16, strided<[?, 1]>>", "tensor<32x64xbf16>", r)),
            "");
  EXPECT_NO_THROW(
      TensorType::make(DType::f8e4m3, {Dim::fixed(32), Dim::fixed(64)}, Layout::strided({1, 32})));
  EXPECT_NO_THROW(TensorType::make(DType::f32, {Dim::fixed(2), Dim::sym("T"), Dim::fixed(8)},
                                   Layout::strided({100, 8, 1})));
  EXPECT_THROW(
      TensorType::make(DType::f32, {Dim::fixed(2), Dim::fixed(8)}, Layout::strided({8, 2})),
      Error);  // columns 2 apart span 16 elements: row 1 starts inside row 0
}

TEST(IrVerifier, ResultTypeMustMatchInference) {
  EXPECT_THAT(
      verify_error(gemm_text("tensor<?Mx64xbf16>", "tensor<32x64xbf16>", "tensor<?Mx32xbf16>")),
      HasSubstr("%0 = gemm: result type tensor<?Mx32xbf16> does not match the inferred type "
                "tensor<?Mx32xf32>"));
}

TEST(IrVerifier, GemmRules) {
  const std::string r = "tensor<?Mx32xf32>";
  EXPECT_EQ(verify_error(gemm_text("tensor<?Mx64xbf16>", "tensor<32x64xbf16>", r)), "");
  EXPECT_EQ(verify_error(gemm_text("tensor<?Mx64xbf16, strided<[?, 1]>>",
                                   "tensor<32x64xbf16, packed<vnni2, n_block=16, k_pair=2>>", r)),
            "");
  EXPECT_THAT(verify_error(gemm_text("tensor<?Mx64xf32>", "tensor<32x64xbf16>", r)),
              HasSubstr("%0 = gemm: operand 'x' (%x) has dtype f32: gemm takes x as bf16"));
  EXPECT_THAT(verify_error(gemm_text("tensor<?Mx64xbf16>", "tensor<32x64xf16>", r)),
              HasSubstr("%0 = gemm: operand 'w' (%w) has dtype f16: gemm takes w as bf16"));
  EXPECT_THAT(
      verify_error(gemm_text("tensor<?Mx64xbf16, strided<[1, ?]>>", "tensor<32x64xbf16>", r)),
      HasSubstr("operand 'x' (%x) has layout strided<[1, ?]>: gemm takes x row_major "
                "with unit stride on the last dim"));
  EXPECT_THAT(verify_error(gemm_text("tensor<?Mx64xbf16, packed<vnni2, n_block=64, k_pair=2>>",
                                     "tensor<32x64xbf16>", r)),
              HasSubstr("operand 'x' (%x) has layout packed<vnni2"));
  EXPECT_THAT(
      verify_error(gemm_text("tensor<?Mx64xbf16>", "tensor<32x64xbf16, strided<[1, 32]>>", r)),
      HasSubstr("gemm takes w row_major (unit stride on the last dim) or packed<vnni2>"));
  EXPECT_THAT(verify_error(gemm_text("tensor<?Mx64xbf16>", "tensor<32x100xbf16>", r)),
              HasSubstr("%0 = gemm: operand 'w' (%w) has K=100 but 'x' (%x) has K=64: the "
                        "reduction dims must match"));
  EXPECT_THAT(verify_error(gemm_text("tensor<?Mx?Kx64xbf16>", "tensor<32x64xbf16>", r)),
              HasSubstr("operand 'x' (%x) has rank 3 (tensor<?Mx?Kx64xbf16>): gemm takes x as "
                        "[M, K]"));
}

// A unary/binary elementwise program: "%0 = <op> <operands> <attrs> : <r>".
std::string ew_text(const std::string& params, const std::string& op, const std::string& r) {
  return "func @e(" + params + ") -> (" + r + ") {\n  %0 = " + op + " : " + r +
         "\n  return %0\n}\n";
}

TEST(IrVerifier, ElementwiseRules) {
  EXPECT_THAT(verify_error(ew_text("%a: tensor<4x8xf32>, %b: tensor<4xf32>", "add %a, %b",
                                   "tensor<4x8xf32>")),
              HasSubstr("%0 = add: operand 'b' (%b) has shape [4] but 'a' (%a) has shape [4, "
                        "8]: add needs equal shapes, or a [N] operand broadcast over [..., N]"));
  EXPECT_THAT(
      verify_error(ew_text("%a: tensor<8xi32>, %b: tensor<8xf32>", "mul %a, %b", "tensor<8xf32>")),
      HasSubstr("%0 = mul: operand 'a' (%a) has dtype i32: mul takes a as f32, bf16"));
  EXPECT_THAT(verify_error(ew_text("%a: tensor<8x8xbf16, packed<vnni2, n_block=8, k_pair=2>>, "
                                   "%b: tensor<8xbf16>",
                                   "mul %a, %b", "tensor<8x8xbf16>")),
              HasSubstr("mul takes row_major operands"));
  EXPECT_THAT(verify_error(ew_text("%a: tensor<8xbf16>", "silu %a", "tensor<8xbf16>")),
              HasSubstr("%0 = silu: operand 'x' (%a) has dtype bf16: silu is elementwise on f32"));
  EXPECT_THAT(verify_error(ew_text("%a: tensor<8xf32>", "cast %a {to = i8}", "tensor<8xi8>")),
              HasSubstr("%0 = cast: target dtype i8 is not supported: cast converts to f32, bf16 "
                        "or f16"));
  EXPECT_THAT(verify_error(ew_text("%a: tensor<8xu4>", "cast %a {to = f32}", "tensor<8xf32>")),
              HasSubstr("operand 'x' (%a) has dtype u4"));
  EXPECT_THAT(verify_error(ew_text("%a: tensor<8xf32>", "cast %a", "tensor<8xf32>")),
              HasSubstr("%0 = cast: missing required attribute 'to'"));
  EXPECT_THAT(
      verify_error(ew_text("%a: tensor<8xf32>", "cast %a {to = \"bf16\"}", "tensor<8xbf16>")),
      HasSubstr("attribute 'to' is a string (\"bf16\"), expected a dtype"));
  EXPECT_THAT(verify_error(ew_text("%a: tensor<8xf32>", "relu %a {alpha = 0.1}", "tensor<8xf32>")),
              HasSubstr("%0 = relu: unknown attribute 'alpha' (relu takes no attributes)"));
}

std::string attn_text(const std::string& q, const std::string& k, const std::string& v,
                      const std::string& attrs, const std::string& r) {
  return "func @a(%q: " + q + ", %k: " + k + ", %v: " + v + ") -> (" + r +
         ") {\n  %0 = attention %q, %k, %v " + attrs + " : " + r + "\n  return %0\n}\n";
}

TEST(IrVerifier, AttentionRules) {
  auto q = [](const char* s) { return std::string("tensor<") + s + ">"; };
  EXPECT_EQ(verify_error(attn_text(q("?Tx32x576xbf16"), q("?Sx1x576xbf16"), q("?Sx1x512xbf16"),
                                   "{window_left = -1}", q("?Tx32x512xbf16"))),
            "");
  // Any even head dim (100, SigLIP's 72) is accepted; an odd one is not.
  EXPECT_EQ(verify_error(attn_text(q("?Tx32x100xbf16"), q("?Sx8x100xbf16"), q("?Sx8x72xbf16"), "",
                                   q("?Tx32x72xbf16"))),
            "");
  EXPECT_THAT(verify_error(attn_text(q("?Tx32x101xbf16"), q("?Sx8x101xbf16"), q("?Sx8x101xbf16"),
                                     "", q("?Tx32x101xbf16"))),
              HasSubstr("%0 = attention: operand 'q' (%q) has head dim D=101: head dims must be "
                        "even (multiples of 2) in [2, 576]"));
  EXPECT_THAT(verify_error(attn_text(q("?Tx32x128xbf16"), q("?Sx8x128xbf16"), q("?Sx8x592xbf16"),
                                     "", q("?Tx32x592xbf16"))),
              HasSubstr("operand 'v' (%v) has head dim Dv=592"));
  EXPECT_THAT(verify_error(attn_text(q("?Tx6x128xbf16"), q("?Sx4x128xbf16"), q("?Sx4x128xbf16"), "",
                                     q("?Tx6x128xbf16"))),
              HasSubstr("operand 'q' (%q) has Hq=6 but 'k' (%k) has Hkv=4: Hq must be a multiple "
                        "of Hkv"));
  EXPECT_THAT(verify_error(attn_text(q("?Tx?Hx128xbf16"), q("?Sx4x128xbf16"), q("?Sx4x128xbf16"),
                                     "", q("?Tx?Hx128xbf16"))),
              HasSubstr("cannot prove Hq is a multiple of Hkv"));
  EXPECT_THAT(verify_error(attn_text(q("?Tx8x?Dxbf16"), q("?Sx8x?Dxbf16"), q("?Sx8x?Dxbf16"), "",
                                     q("?Tx8x?Dxbf16"))),
              HasSubstr("operand 'q' (%q) has D=?D: head dims must be static"));
  EXPECT_THAT(verify_error(attn_text(q("?Tx8x64xbf16"), q("?Sx8x64xf16"), q("?Sx8x64xbf16"), "",
                                     q("?Tx8x64xbf16"))),
              HasSubstr("operand 'k' (%k) has dtype f16 but 'q' (%q) has bf16: q, k and v share "
                        "one dtype"));
  EXPECT_THAT(verify_error(attn_text(q("?Tx8x64xbf16"), q("?Sx8x64xbf16"), q("?Ux8x64xbf16"), "",
                                     q("?Tx8x64xbf16"))),
              HasSubstr("operand 'v' (%v) has S=?U but 'k' (%k) has S=?S"));
  // The operators' rule (ir/attention_rules.h): any finite sm_scale, 0 and
  // negative ones included (the IR refused them while the API ran them).
  for (const char* s : {"{sm_scale = -1.0}", "{sm_scale = 0.0}"})
    EXPECT_EQ(verify_error(attn_text(q("?Tx8x64xbf16"), q("?Sx8x64xbf16"), q("?Sx8x64xbf16"), s,
                                     q("?Tx8x64xbf16"))),
              "")
        << s;
  EXPECT_THAT(verify_error(attn_text(q("?Tx8x64xbf16"), q("?Sx8x64xbf16"), q("?Sx8x64xbf16"),
                                     "{softcap = -1.0}", q("?Tx8x64xbf16"))),
              HasSubstr("%0 = attention: attribute 'softcap' = -1; allowed: 0 (off) or a finite "
                        "value > 0"));
  EXPECT_THAT(verify_error(attn_text(q("?Tx8x64xbf16"), q("?Sx8x64xbf16"), q("?Sx8x64xbf16"),
                                     "{window_left = -2}", q("?Tx8x64xbf16"))),
              HasSubstr("attribute 'window_left' = -2; allowed: -1 (unbounded) or >= 0"));
  EXPECT_THAT(verify_error(attn_text(q("?Tx8x64xbf16"), q("?Sx8x64xbf16"), q("?Sx8x64xbf16"),
                                     "{causal = 1}", q("?Tx8x64xbf16"))),
              HasSubstr("attribute 'causal' is a int (1), expected a bool"));
}

// AttentionOptions' per-head tensors as named operands of both attention ops:
// sinks and alibi_slopes, f32 [Hq].
TEST(IrVerifier, AttentionSinksAndAlibiSlopes) {
  const std::string prefill =
      "func @a(%q: tensor<?Tx8x64xbf16>, %k: tensor<?Sx2x64xbf16>, %v: tensor<?Sx2x64xbf16>, "
      "%s: PARAM) -> (tensor<?Tx8x64xbf16>) {\n  %0 = attention %q, %k, %v, NAMED {causal = true} "
      ": tensor<?Tx8x64xbf16>\n  return %0\n}\n";
  const std::string decode =
      "func @d(%q: tensor<2x8x64xbf16>, %kc: tensor<9x1x2x64xbf16>, %vc: tensor<9x1x2x64xbf16>, "
      "%bt: tensor<2x5xi32>, %sl: tensor<2xi32>, %s: PARAM) -> (tensor<2x8x64xbf16>) {\n  %0 = "
      "decode_attention %q, %kc, %vc, %bt, %sl, NAMED : tensor<2x8x64xbf16>\n  return %0\n}\n";
  auto text = [](std::string t, const std::string& param, const std::string& named) {
    t.replace(t.find("PARAM"), 5, param);
    t.replace(t.find("NAMED"), 5, named);
    return t;
  };
  for (const std::string& t : {prefill, decode}) {
    for (const char* named : {"sinks = %s", "alibi_slopes = %s"}) {
      const std::string ok = text(t, "tensor<8xf32>", named);
      SCOPED_TRACE(ok);
      EXPECT_EQ(verify_error(ok), "");
      EXPECT_EQ(print(parse(ok)), ok);
    }
    EXPECT_THAT(verify_error(text(t, "tensor<7xf32>", "sinks = %s")),
                HasSubstr("operand 'sinks' (%s) has Hq=7 but 'q' (%q) has Hq=8: one value per "
                          "query head"));
    EXPECT_THAT(verify_error(text(t, "tensor<8xbf16>", "alibi_slopes = %s")),
                HasSubstr("operand 'alibi_slopes' (%s) has dtype bf16"));
    EXPECT_THAT(verify_error(text(t, "tensor<1x8xf32>", "sinks = %s")),
                HasSubstr("operand 'sinks' (%s)"));
    EXPECT_THAT(verify_error(text(t, "tensor<8xf32>", "scale = %s")),
                HasSubstr("has no operand 'scale' (its named operands are sinks, alibi_slopes)"));
  }
}

std::string decode_text(const std::string& q, const std::string& kc, const std::string& vc,
                        const std::string& table, const std::string& lens, const std::string& attrs,
                        const std::string& r) {
  return "func @d(%q: " + q + ", %kc: " + kc + ", %vc: " + vc + ", %bt: " + table +
         ", %sl: " + lens + ") -> (" + r + ") {\n  %0 = decode_attention %q, %kc, %vc, %bt, %sl " +
         attrs + " : " + r + "\n  return %0\n}\n";
}

TEST(IrVerifier, DecodeAttentionRules) {
  auto t = [](const char* s) { return std::string("tensor<") + s + ">"; };
  const std::string q = t("?Bx32x128xbf16"), kc = t("?Nx16x8x128xbf16"), table = t("?Bx?Mxi32"),
                    lens = t("?Bxi32"), r = t("?Bx32x128xbf16");
  auto err = [&](const std::string& q_, const std::string& kc_, const std::string& vc_,
                 const std::string& table_, const std::string& lens_, const std::string& attrs,
                 const std::string& r_) {
    return verify_error(decode_text(q_, kc_, vc_, table_, lens_, attrs, r_));
  };
  EXPECT_EQ(err(q, kc, kc, table, lens, "{softcap = 30.0, window_left = 100}", r), "");
  // An fp8 cache with its scales; MLA-like D != Dv; token-granular blocks.
  EXPECT_EQ(err(t("2x16x576xbf16"), t("9x1x1x576xf8e4m3"), t("9x1x1x512xf8e4m3"), t("2x5xi32"),
                t("2xi32"), "{k_scale = 0.5, v_scale = 2.0}", t("2x16x512xbf16")),
            "");
  // An e5m2 cache takes the same scales (vLLM's fp8_e5m2).
  EXPECT_EQ(err(q, t("?Nx16x8x128xf8e5m2"), t("?Nx16x8x128xf8e5m2"), table, lens,
                "{k_scale = 0.25, v_scale = 4.0}", r),
            "");
  EXPECT_EQ(err(q, t("?Nx16x8x128xf8e5m2"), t("?Nx16x8x128xf8e5m2"), table, lens, "", r), "");
  // The printer gives back what the parser read.
  const std::string text = decode_text(q, kc, kc, table, lens, "{sm_scale = 0.125}", r);
  EXPECT_EQ(print(parse(text)), text);

  EXPECT_THAT(err(q, t("?Nx16x8x128xf16"), t("?Nx16x8x128xf16"), table, lens, "", r),
              HasSubstr("operand 'k_cache' (%kc) has dtype f16: decode_attention takes k_cache as "
                        "bf16, f8e4m3, f8e5m2"));
  EXPECT_THAT(err(q, kc, t("?Nx16x8x128xf8e4m3"), table, lens, "", r),
              HasSubstr("operand 'v_cache' (%vc) has dtype f8e4m3 but 'k_cache' (%kc) has bf16: "
                        "k_cache and v_cache share one dtype"));
  EXPECT_THAT(err(q, t("?Nx16x8x128xf8e4m3"), t("?Nx16x8x128xf8e5m2"), table, lens, "", r),
              HasSubstr("operand 'v_cache' (%vc) has dtype f8e5m2 but 'k_cache' (%kc) has f8e4m3: "
                        "k_cache and v_cache share one dtype"));
  EXPECT_THAT(err(t("?Bx32x128xf32"), kc, kc, table, lens, "", r),
              HasSubstr("operand 'q' (%q) has dtype f32: decode_attention takes q as bf16"));
  EXPECT_THAT(err(q, t("?Nx8x128xbf16"), kc, table, lens, "", r),
              HasSubstr("operand 'k_cache' (%kc) has rank 3"));
  EXPECT_THAT(err(q, kc, kc, t("?Bx?Mxi64"), lens, "", r),
              HasSubstr("operand 'block_table' (%bt) has dtype i64"));
  EXPECT_THAT(err(q, kc, kc, t("?Cx?Mxi32"), lens, "", r),
              HasSubstr("operand 'block_table' (%bt) has B=?C but 'q' (%q) has B=?B: one "
                        "block-table row per sequence"));
  EXPECT_THAT(err(q, kc, t("?Nx8x8x128xbf16"), table, lens, "", r),
              HasSubstr("k_cache and v_cache have one block size"));
  EXPECT_THAT(err(q, t("?Nx0x8x128xbf16"), t("?Nx0x8x128xbf16"), table, lens, "", r),
              HasSubstr("has block_size=0"));
  EXPECT_THAT(err(t("?Bx12x128xbf16"), kc, kc, table, lens, "", t("?Bx12x128xbf16")),
              HasSubstr("operand 'q' (%q) has Hq=12 but 'k_cache' (%kc) has Hkv=8: Hq must be a "
                        "multiple of Hkv"));
  EXPECT_THAT(err(t("?Bx32x99xbf16"), t("?Nx16x8x99xbf16"), t("?Nx16x8x99xbf16"), table, lens, "",
                  t("?Bx32x99xbf16")),
              HasSubstr("has head dim D=99: head dims must be even"));
  EXPECT_THAT(err(q, kc, kc, table, lens, "{k_scale = 0.5}", r),
              HasSubstr("attribute 'k_scale' needs an fp8 (f8e4m3 or f8e5m2) cache; 'k_cache' "
                        "(%kc) is bf16"));
  EXPECT_THAT(err(q, kc, kc, table, lens, "{v_scale = 2.0}", r),
              HasSubstr("attribute 'v_scale' needs an fp8 (f8e4m3 or f8e5m2) cache; 'k_cache' "
                        "(%kc) is bf16"));
  EXPECT_THAT(
      err(q, t("?Nx16x8x128xf8e5m2"), t("?Nx16x8x128xf8e5m2"), table, lens, "{k_scale = -1.0}", r),
      HasSubstr("attribute 'k_scale' = -1; allowed: a finite value > 0"));
  EXPECT_THAT(
      err(q, t("?Nx16x8x128xf8e4m3"), t("?Nx16x8x128xf8e4m3"), table, lens, "{v_scale = 0.0}", r),
      HasSubstr("attribute 'v_scale' = 0; allowed: a finite value > 0"));
  EXPECT_THAT(err(q, kc, kc, table, lens, "{causal = true}", r),
              HasSubstr("unknown attribute 'causal' (decode_attention takes sm_scale, "
                        "window_left, softcap, k_scale, v_scale)"));
}

std::string rope_text(const std::string& q, const std::string& pos, const std::string& cs,
                      const std::string& attrs) {
  return "func @r(%q: " + q + ", %pos: " + pos + ", %cs: " + cs + ") -> (" + q +
         ") {\n  %0 = rope %q, %pos, %cs " + attrs + " : " + q + "\n  return %0\n}\n";
}

TEST(IrVerifier, RopeRules) {
  const std::string q = "tensor<?Tx8x128xbf16>", pos = "tensor<?Txi32>";
  EXPECT_EQ(verify_error(rope_text(q, pos, "tensor<?Px64xf32>", "{rotary_dim = 64}")), "");
  // int64 positions, as PyTorch engines pass them.
  EXPECT_EQ(verify_error(rope_text(q, "tensor<?Txi64>", "tensor<?Px128xf32>", "")), "");
  EXPECT_THAT(verify_error(rope_text("tensor<?Tx8x63xf32>", pos, "tensor<?Px63xf32>", "")),
              HasSubstr("%0 = rope: operand 'q' (%q) has head dim D=63: rope rotates pairs, D "
                        "must be even"));
  EXPECT_THAT(verify_error(rope_text(q, pos, "tensor<?Px256xf32>", "{rotary_dim = 256}")),
              HasSubstr("attribute 'rotary_dim' = 256 with 'q' (%q) head dim D=128: rotary_dim "
                        "must be even and <= D"));
  EXPECT_THAT(verify_error(rope_text(q, pos, "tensor<?Px64xf32>", "")),
              HasSubstr("operand 'cos_sin' (%cs) has 64 columns but rotary_dim=128"));
  EXPECT_THAT(
      verify_error(rope_text(q, "tensor<?Txf32>", "tensor<?Px128xf32>", "")),
      HasSubstr("operand 'positions' (%pos) has dtype f32: rope takes positions as i32, i64"));
  EXPECT_THAT(verify_error(rope_text(q, "tensor<?Uxi32>", "tensor<?Px128xf32>", "")),
              HasSubstr("operand 'positions' (%pos) has T=?U but 'q' (%q) has T=?T"));
  EXPECT_THAT(verify_error(rope_text(q, pos, "tensor<?Px128xf32>", "{style = \"llama\"}")),
              HasSubstr("attribute 'style' = \"llama\" must be one of \"neox\", \"gptj\""));
}

std::string moe_text(const std::string& w13, const std::string& tw, const std::string& attrs) {
  const std::string h = "tensor<?Tx256xbf16>";
  return "func @m(%h: " + h + ", %w13: " + w13 + ", %w2: tensor<4x256x64xbf16>, %tw: " + tw +
         ", %ti: tensor<?Tx2xi32>) -> (" + h + ") {\n  %0 = moe %h, %w13, %w2, %tw, %ti " + attrs +
         " : " + h + "\n  return %0\n}\n";
}

TEST(IrVerifier, MoeRules) {
  const std::string w13 = "tensor<4x128x256xbf16>", tw = "tensor<?Tx2xf32>";
  EXPECT_EQ(verify_error(moe_text(w13, tw, "{top_k = 2}")), "");
  EXPECT_THAT(verify_error(moe_text(w13, tw, "")),
              HasSubstr("%0 = moe: missing required attribute 'top_k'"));
  EXPECT_THAT(verify_error(moe_text(w13, tw, "{top_k = 3}")),
              HasSubstr("operand 'topk_weights' (%tw) has 2 columns but top_k=3"));
  EXPECT_THAT(verify_error(moe_text("tensor<4x64x256xbf16>", tw, "{top_k = 2}")),
              HasSubstr("operand 'w13' (%w13) has 2*I=64 but 'w2' (%w2) has I=64"));
  EXPECT_THAT(verify_error(moe_text("tensor<4x128x512xbf16>", tw, "{top_k = 2}")),
              HasSubstr("operand 'w13' (%w13) has H=512 but 'hidden' (%h) has H=256"));
  EXPECT_THAT(verify_error(moe_text(w13, "tensor<?Tx2xbf16>", "{top_k = 2}")),
              HasSubstr("operand 'topk_weights' (%tw) has dtype bf16: moe takes topk_weights as "
                        "f32"));
  EXPECT_THAT(verify_error(moe_text(w13, tw, "{activation = \"relu\", top_k = 2}")),
              HasSubstr("attribute 'activation' = \"relu\" must be one of"));
  EXPECT_THAT(verify_error(moe_text(w13, tw, "{top_k = 0}")),
              HasSubstr("attribute 'top_k' = 0 must be >= 1"));
  EXPECT_EQ(verify_error(moe_text(w13, tw,
                                  "{activation = \"clamped_swiglu\", swiglu_alpha = 1.702, "
                                  "swiglu_limit = 7.0, routed_scaling_factor = 2.5, top_k = 2}")),
            "");
  EXPECT_THAT(verify_error(moe_text(w13, tw,
                                    "{activation = \"clamped_swiglu\", swiglu_limit = 0.0, "
                                    "top_k = 2}")),
              HasSubstr("attribute 'swiglu_limit' = 0 must be > 0"));
  // gated = false (Nemotron-H's non-gated experts): w13 is [E, I, H] and any
  // activation applies; what describes a gated w13 is refused.
  const std::string w1 = "tensor<4x64x256xbf16>";
  EXPECT_EQ(verify_error(moe_text(w1, tw, "{activation = \"relu2\", gated = false, top_k = 2}")),
            "");
  EXPECT_THAT(verify_error(moe_text(w13, tw, "{activation = \"relu2\", gated = false, top_k = 2}")),
              HasSubstr("operand 'w13' (%w13) has I=128 but 'w2' (%w2) has I=64: w13 is the up "
                        "projection (gated = false)"));
  EXPECT_THAT(verify_error(moe_text(w13, tw, "{activation = \"relu2\", top_k = 2}")),
              HasSubstr("attribute 'activation' = \"relu2\" must be one of"));
  EXPECT_THAT(verify_error(moe_text(w1, tw,
                                    "{activation = \"clamped_swiglu\", gated = false, "
                                    "top_k = 2}")),
              HasSubstr("attribute 'activation' = \"clamped_swiglu\" must be one of"));
  EXPECT_THAT(verify_error(moe_text(w1, tw,
                                    "{gated = false, glu_rows = \"interleaved\", "
                                    "top_k = 2}")),
              HasSubstr("attribute 'glu_rows' with gated = false"));
}

TEST(IrVerifier, CheckCollectsEveryProblem) {
  Function f = parse(gemm_text("tensor<?Mx64xf32>", "tensor<32x100xf16>", "tensor<?Mx32xf32>"));
  std::vector<Diagnostic> d = check(f);
  ASSERT_EQ(d.size(), 2u);  // both dtypes; K is checked once the dtypes are right
  EXPECT_EQ(d[0].op_index, 0);
  EXPECT_EQ(d[0].value_id, f.ops[0].result);
  EXPECT_THAT(d[0].message, HasSubstr("operand 'x'"));
  EXPECT_THAT(d[1].message, HasSubstr("operand 'w'"));
}

// ---- quantized weights ---------------------------------------------------------------

// A one-gemm program over the given params (name: type) and gemm operand text.
std::string quant_text(const std::string& params, const std::string& operands,
                       const std::string& attrs, const std::string& n = "64") {
  return "func @q(%x: tensor<?Mx128xbf16>, " + params + ") -> (tensor<?Mx" + n +
         "xf32>) {\n  %0 = gemm %x, " + operands + (attrs.empty() ? "" : " " + attrs) +
         " : tensor<?Mx" + n + "xf32>\n  return %0\n}\n";
}

TEST(IrQuant, PrintParseRoundTrips) {
  const std::vector<std::string> texts = {
      quant_text("%w: tensor<64x128xi8>, %s: tensor<64xf32>", "%w, scale = %s", ""),
      quant_text("%w: tensor<64x128xi8>, %s: tensor<1xf32>", "%w, scale = %s",
                 "{act_quant = \"fixed\", act_scale = 0.015625, act_zero_point = 128}"),
      quant_text("%w: tensor<64x128xf8e4m3>, %s: tensor<1xf32>", "%w, scale = %s", ""),
      quant_text("%w: tensor<64x128xf8e4m3, strided<[1, 64]>>, %s: tensor<64xf32>",
                 "%w, scale = %s", ""),
      quant_text("%w: tensor<64x128xf8e4m3>, %s: tensor<1x2xf32>", "%w, scale = %s",
                 "{block_k = 64, block_n = 128}"),
      quant_text("%w: tensor<64x128xu4>, %s: tensor<1x64xf16>", "%w, scale = %s",
                 "{format = \"gptq\", group_size = 128}"),
      quant_text("%w: tensor<64x128xu4>, %s: tensor<4x64xbf16>, %z: tensor<4x64xu4>",
                 "%w, scale = %s, zero = %z", "{format = \"awq\", group_size = 32}"),
      quant_text(
          "%w: tensor<64x128xu4>, %s: tensor<2x64xf32>, %z: tensor<2x64xu4>, %g: tensor<128xi32>",
          "%w, scale = %s, zero = %z, g_idx = %g",
          "{bits = 4, format = \"gptq\", gptq_v2 = true, group_size = 64}"),
      quant_text("%w: tensor<64x128xu4>, %s: tensor<1x64xf32>, %g: tensor<128xi32>",
                 "%w, scale = %s, g_idx = %g", "{format = \"gptq\", group_size = -1}"),
      // Any group size pack_weight takes (AutoRound exports, TP shards).
      quant_text("%w: tensor<64x128xu4>, %s: tensor<2x64xf16>", "%w, scale = %s",
                 "{format = \"gptq\", group_size = 96}"),
      // MXFP4: any K (a partial last block of 32).
      quant_text("%w: tensor<64x128xf4e2m1>, %s: tensor<64x4xu8>", "%w, scale = %s", ""),
      "func @q(%x: tensor<?Mx100xbf16>, %w: tensor<64x100xf4e2m1>, %s: tensor<64x4xu8>) -> "
      "(tensor<?Mx64xf32>) {\n  %0 = gemm %x, %w, scale = %s : tensor<?Mx64xf32>\n  return "
      "%0\n}\n",
  };
  for (const std::string& t : texts) {
    SCOPED_TRACE(t);
    const Function f = parse(t);
    EXPECT_EQ(verify_error(f), "");
    EXPECT_EQ(print(f), t);  // the texts are canonical
    EXPECT_EQ(print(parse(print(f))), print(f));
    EXPECT_EQ(parse(print(f)), f);
  }
}

TEST(IrQuant, NamedOperandsAreCanonical) {
  // Named operands in any order read back in the canonical order.
  const Function f = parse(quant_text(
      "%w: tensor<64x128xu4>, %s: tensor<2x64xf32>, %z: tensor<2x64xu4>, %g: tensor<128xi32>",
      "%w, g_idx = %g, zero = %z, scale = %s", "{format = \"gptq\", group_size = 64}"));
  EXPECT_EQ(verify_error(f), "");
  EXPECT_THAT(print(f), HasSubstr("gemm %x, %w, scale = %s, zero = %z, g_idx = %g {"));
  ASSERT_EQ(f.ops[0].operand_names.size(), 3u);
  EXPECT_EQ(operand_role(f.ops[0], 4), "g_idx");
}

TEST(IrQuant, NamedOperandsAfterExtraPositionalsRoundTrip) {
  // Found by fuzz/ir_pipeline_fuzzer: a `moe` renamed `cast` keeps five
  // positional operands and two named ones. The printer named operands by
  // cast's one positional role, so its output put a positional operand
  // after a named one and did not parse. The named ones are the last ones.
  const Function f = parse(quant_text(
      "%w: tensor<64x128xi8>, %s: tensor<64xf32>, %z: tensor<64xf32>", "%w, %s, scale = %z", ""));
  ASSERT_EQ(f.ops[0].operand_names.size(), 1u);
  EXPECT_THAT(print(f), HasSubstr("gemm %x, %w, %s, scale = %z :"));
  EXPECT_EQ(parse(print(f)), f);
  EXPECT_EQ(operand_role(f.ops[0], 2), "#2");
  EXPECT_EQ(operand_role(f.ops[0], 3), "scale");
  EXPECT_THAT(verify_error(f), HasSubstr("operands"));
}

TEST(IrQuant, BuilderMatchesParser) {
  Builder b("q");
  int x = b.param("x", T(DType::bf16, {S("M"), F(128)}));
  int w = b.param("w", T(DType::u4, {F(64), F(128)}));
  int s = b.param("s", T(DType::f16, {F(4), F(64)}));
  int z = b.param("z", T(DType::u4, {F(4), F(64)}));
  int y =
      b.gemm_quant(x, w, s, Attrs{{"format", std::string("awq")}, {"group_size", int64_t{32}}}, z);
  b.ret({y});
  const Function f = b.finish();
  EXPECT_EQ(print(f),
            quant_text("%w: tensor<64x128xu4>, %s: tensor<4x64xf16>, %z: tensor<4x64xu4>",
                       "%w, scale = %s, zero = %z", "{format = \"awq\", group_size = 32}"));
  EXPECT_EQ(parse(print(f)), f);
}

TEST(IrQuant, ParserErrors) {
  auto parse_error = [](const std::string& t) -> std::string {
    try {
      parse(t);
    } catch (const ParseError& e) {
      return e.detail();
    }
    return "";
  };
  EXPECT_THAT(parse_error(quant_text("%w: tensor<64x128xi8>, %s: tensor<64xf32>",
                                     "%w, scale = %s, scale = %s", "")),
              HasSubstr("operand 'scale' given twice"));
  EXPECT_THAT(
      parse_error(quant_text("%w: tensor<64x128xi8>, %s: tensor<64xf32>", "scale = %s, %w", "")),
      HasSubstr("a positional operand after a named one"));
  EXPECT_THAT(
      parse_error(quant_text("%w: tensor<64x128xi8>, %s: tensor<64xf32>", "%w, scale %s", "")),
      HasSubstr("expected '='"));
}

TEST(IrQuant, VerifierErrorsNameTheOperandOrAttribute) {
  struct Case {
    std::string params, operands, attrs, message;
  };
  const std::string i8 = "%w: tensor<64x128xi8>, ";
  const std::string f8 = "%w: tensor<64x128xf8e4m3>, ";
  const std::string u4 = "%w: tensor<64x128xu4>, ";
  const std::string mx = "%w: tensor<64x128xf4e2m1>, ";
  const std::vector<Case> cases = {
      // i8
      {i8 + "%s: tensor<32xf32>", "%w, scale = %s", "",
       "operand 'scale' (%s) has shape [32]; an i8 weight takes scale as f32 [N] (per channel, "
       "N=64) or [1] (per tensor)"},
      {i8 + "%s: tensor<64xf16>", "%w, scale = %s", "", "operand 'scale' (%s) has dtype f16"},
      {"%w: tensor<64x128xi8>", "%w", "", "a quantized weight needs a 'scale' operand"},
      {i8 + "%s: tensor<64xf32>, %z: tensor<1x64xu4>", "%w, scale = %s, zero = %z", "",
       "operand 'zero' (%z): an i8 weight has no zero point"},
      {i8 + "%s: tensor<64xf32>", "%w, scale = %s", "{act_quant = \"fixed\"}",
       "attribute 'act_quant' = \"fixed\" needs attribute 'act_scale'"},
      {i8 + "%s: tensor<64xf32>", "%w, scale = %s", "{act_quant = \"static\"}",
       "attribute 'act_quant' = \"static\" must be one of"},
      {i8 + "%s: tensor<64xf32>", "%w, scale = %s", "{act_scale = 0.5}",
       "attribute 'act_scale' applies to act_quant = \"fixed\" only"},
      {i8 + "%s: tensor<64xf32>", "%w, scale = %s",
       "{act_quant = \"fixed\", act_scale = 0.5, act_zero_point = 300}",
       "attribute 'act_zero_point' = 300 must be in [0, 255]"},
      {i8 + "%s: tensor<64xf32>", "%w, scale = %s", "{group_size = 128}",
       "attribute 'group_size' applies to u4 weights only; 'w' (%w) is i8"},
      // f8e4m3
      {f8 + "%s: tensor<64xf32>, %z: tensor<1x64xu4>", "%w, scale = %s, zero = %z", "",
       "operand 'zero' (%z): an f8e4m3 weight has no zero point"},
      {f8 + "%s: tensor<32xf32>", "%w, scale = %s", "",
       "operand 'scale' (%s) has shape [32]; an f8e4m3 weight takes scale as f32 [1] (per "
       "tensor), [N] (per channel, N=64)"},
      {f8 + "%s: tensor<1x1xf32>", "%w, scale = %s", "",
       "block scales need attributes 'block_n' and 'block_k'"},
      {f8 + "%s: tensor<1x2xf32>", "%w, scale = %s", "{block_k = 128, block_n = 128}",
       "operand 'scale' (%s) has shape [1, 2]; block scales of 128x128 over N=64, K=128 are f32 "
       "[1, 1]"},
      // Block sizes near INT64_MAX count one block (ceil_div without overflow).
      {f8 + "%s: tensor<0x1xf32>", "%w, scale = %s",
       "{block_k = 9223372036854775806, block_n = 9223372036854775807}",
       "operand 'scale' (%s) has shape [0, 1]; block scales of "
       "9223372036854775807x9223372036854775806 over N=64, K=128 are f32 [1, 1]"},
      {f8 + "%s: tensor<1x1xf32>", "%w, scale = %s", "{block_k = 127, block_n = 128}",
       "attribute 'block_k' = 127 must be even"},
      {f8 + "%s: tensor<64xf32>", "%w, scale = %s", "{block_k = 128, block_n = 128}",
       "attribute 'block_n' needs block scales"},
      {f8 + "%s: tensor<64xf32>, %g: tensor<128xi32>", "%w, scale = %s, g_idx = %g", "",
       "operand 'g_idx' (%g): an f8e4m3 weight has no g_idx"},
      // u4
      {u4 + "%s: tensor<1x64xf16>", "%w, scale = %s", "{format = \"gptq\", bits = 8}",
       "attribute 'bits' = 8; allowed: 4"},
      {u4 + "%s: tensor<1x64xf16>", "%w, scale = %s", "{format = \"gptq\", group_size = 0}",
       "attribute 'group_size' = 0; allowed: a group size >= 1 (32, 64, 128, ...) or -1"},
      {u4 + "%s: tensor<1x64xf16>", "%w, scale = %s", "", "a u4 weight needs attribute 'format'"},
      {u4 + "%s: tensor<1x64xf16>", "%w, scale = %s", "{format = \"exl2\"}",
       "attribute 'format' = \"exl2\" must be one of \"awq\", \"gptq\""},
      {u4 + "%s: tensor<1x64xf16>", "%w, scale = %s", "{format = \"awq\", gptq_v2 = true}",
       "attribute 'gptq_v2' = true applies to format = \"gptq\" only"},
      {u4 + "%s: tensor<2x64xf16>", "%w, scale = %s", "{format = \"gptq\"}",
       "operand 'scale' (%s) has shape [2, 64]; a u4 weight of K=128 in groups of 128 takes "
       "scale as [G, N] = [1, 64]"},
      {u4 + "%s: tensor<4x64xf16>, %z: tensor<4x32xu4>", "%w, scale = %s, zero = %z",
       "{format = \"awq\", group_size = 32}",
       "operand 'zero' (%z) has shape [4, 32]; zero points are u4 [G, N] like 'scale' ([4, 64])"},
      {u4 + "%s: tensor<4x64xf16>, %z: tensor<4x64xi32>", "%w, scale = %s, zero = %z",
       "{format = \"awq\", group_size = 32}", "operand 'zero' (%z) has dtype i32"},
      {u4 + "%s: tensor<1x64xf16>, %g: tensor<64xi32>", "%w, scale = %s, g_idx = %g",
       "{format = \"gptq\"}", "operand 'g_idx' (%g) has shape [64]; g_idx is i32 [K]"},
      {u4 + "%s: tensor<1x64xf16>", "%w, scale = %s", "{block_n = 128, format = \"gptq\"}",
       "attribute 'block_n' applies to f8e4m3 weights only; 'w' (%w) is u4"},
      // bf16 and the named operands themselves
      {"%w: tensor<64x128xbf16>, %s: tensor<64xf32>", "%w, scale = %s", "",
       "operand 'scale' (%s): a bf16 weight takes no 'scale'"},
      {i8 + "%s: tensor<64xf32>", "%w, bias = %s", "",
       "%0 = gemm: has no operand 'bias' (its named operands are scale, zero, g_idx)"},
      {"%w: tensor<64x128xf32>", "%w", "",
       "operand 'w' (%w) has dtype f32: gemm takes w as bf16, i8, f8e4m3, u4"},
      {"%w: tensor<64x128xu4, strided<[256, 1]>>, %s: tensor<1x64xf16>", "%w, scale = %s",
       "{format = \"gptq\"}",
       "gemm takes a u4 weight as the checkpoint's int32-packed qweight, contiguous"},
      // f4e2m1 (MXFP4): e8m0 exponent bytes [N, ceil(K/32)], nothing else
      {mx + "%s: tensor<64x3xu8>", "%w, scale = %s", "",
       "operand 'scale' (%s) has shape [64, 3]; an f4e2m1 weight of N=64, K=128 takes scale as "
       "its e8m0 exponents, u8 [N, ceil(K/32)] = [64, 4]"},
      {mx + "%s: tensor<64x4xf32>", "%w, scale = %s", "", "operand 'scale' (%s) has dtype f32"},
      {"%w: tensor<64x128xf4e2m1>", "%w", "", "a quantized weight needs a 'scale' operand"},
      {mx + "%s: tensor<64x4xu8>, %z: tensor<4x64xu4>", "%w, scale = %s, zero = %z", "",
       "operand 'zero' (%z): an f4e2m1 weight has no zero point"},
      {mx + "%s: tensor<64x4xu8>, %g: tensor<128xi32>", "%w, scale = %s, g_idx = %g", "",
       "operand 'g_idx' (%g): an f4e2m1 weight has no g_idx"},
      {mx + "%s: tensor<64x4xu8>", "%w, scale = %s", "{group_size = 32}",
       "attribute 'group_size' applies to u4 weights only; 'w' (%w) is f4e2m1"},
      {"%w: tensor<64x128xf4e2m1, strided<[256, 1]>>, %s: tensor<64x4xu8>", "%w, scale = %s", "",
       "gemm takes an f4e2m1 weight as the checkpoint's blocks, two codes a byte, contiguous"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.params + " | " + c.operands + " | " + c.attrs);
    const std::string e = verify_error(quant_text(c.params, c.operands, c.attrs));
    EXPECT_THAT(e, ::testing::StartsWith("%0 = gemm: "));
    EXPECT_THAT(e, HasSubstr(c.message));
  }
  // A hand-built op with the named operands out of order.
  Function f = parse(quant_text("%w: tensor<64x128xu4>, %s: tensor<1x64xf16>, %z: tensor<1x64xu4>",
                                "%w, scale = %s, zero = %z", "{format = \"gptq\"}"));
  std::swap(f.ops[0].operand_names[0], f.ops[0].operand_names[1]);
  std::swap(f.ops[0].operands[2], f.ops[0].operands[3]);
  EXPECT_THAT(verify_error(f), HasSubstr("operand 'scale' is given twice or out of order"));
}

// ---- quantized experts -------------------------------------------------------------

// A one-moe program: E=4, H=128, I=64 experts of dtype `wt`, extra params
// and named operands.
std::string moe_quant_text(const std::string& wt, const std::string& params,
                           const std::string& named, const std::string& attrs) {
  const std::string h = "tensor<?Tx128xbf16>";
  return "func @m(%h: " + h + ", %w13: tensor<4x128x128x" + wt + ">, %w2: tensor<4x128x64x" + wt +
         ">, %tw: tensor<?Tx2xf32>, %ti: tensor<?Tx2xi32>" + (params.empty() ? "" : ", " + params) +
         ") -> (" + h + ") {\n  %0 = moe %h, %w13, %w2, %tw, %ti" +
         (named.empty() ? "" : ", " + named) + " " + attrs + " : " + h + "\n  return %0\n}\n";
}

const char* const kMoeI8Params = "%s13: tensor<4x128xf32>, %s2: tensor<4x1xf32>";
const char* const kMoeF8Params = "%s13: tensor<4x2x2xf32>, %s2: tensor<4x2x1xf32>";
const char* const kMoeMxParams = "%s13: tensor<4x128x4xu8>, %s2: tensor<4x128x2xu8>";
const char* const kMoeU4Params =
    "%s13: tensor<4x2x128xf16>, %z13: tensor<4x2x128xu4>, %g13: "
    "tensor<4x128xi32>, "
    "%s2: tensor<4x1x128xf16>, %z2: tensor<4x1x128xu4>";

TEST(IrQuantExperts, PrintParseRoundTrips) {
  const std::vector<std::string> texts = {
      moe_quant_text("i8", kMoeI8Params, "scale13 = %s13, scale2 = %s2", "{top_k = 2}"),
      moe_quant_text("i8", kMoeI8Params, "scale13 = %s13, scale2 = %s2",
                     "{act_quant = \"dynamic_asym\", top_k = 2}"),
      moe_quant_text("f8e4m3", "%s13: tensor<4x128xf32>, %s2: tensor<4x1xf32>",
                     "scale13 = %s13, scale2 = %s2", "{top_k = 2}"),
      moe_quant_text("f8e4m3", kMoeF8Params, "scale13 = %s13, scale2 = %s2",
                     "{block_k = 64, block_n = 64, top_k = 2}"),
      moe_quant_text("u4", kMoeU4Params,
                     "scale13 = %s13, zero13 = %z13, g_idx13 = %g13, scale2 = "
                     "%s2, zero2 = %z2",
                     "{format = \"gptq\", group_size = 64, top_k = 2}"),
      moe_quant_text("u4", "%s13: tensor<4x4x128xbf16>, %s2: tensor<4x2x128xbf16>",
                     "scale13 = %s13, scale2 = %s2",
                     "{activation = \"gelu_tanh\", format = \"awq\", "
                     "group_size = 32, top_k = 2}"),
      moe_quant_text("u4", "%s13: tensor<4x3x128xf16>, %s2: tensor<4x2x128xf16>",
                     "scale13 = %s13, scale2 = %s2",
                     "{format = \"awq\", group_size = 48, top_k = 2}"),
      moe_quant_text("f4e2m1", kMoeMxParams, "scale13 = %s13, scale2 = %s2",
                     "{activation = \"clamped_swiglu\", top_k = 2}"),
      moe_quant_text("f4e2m1", kMoeMxParams, "scale13 = %s13, scale2 = %s2",
                     "{activation = \"clamped_swiglu\", glu_rows = \"interleaved\", top_k = 2}"),
  };
  for (const std::string& t : texts) {
    SCOPED_TRACE(t);
    const Function f = parse(t);
    EXPECT_EQ(verify_error(f), "");
    EXPECT_EQ(print(f), t);  // the texts are canonical
    EXPECT_EQ(print(parse(print(f))), print(f));
    EXPECT_EQ(parse(print(f)), f);
  }
  // Named operands in any order read back in the canonical order.
  const Function f = parse(moe_quant_text("u4", kMoeU4Params,
                                          "zero2 = %z2, g_idx13 = %g13, scale2 = %s2, zero13 "
                                          "= %z13, scale13 = %s13",
                                          "{format = \"gptq\", group_size = 64, top_k = 2}"));
  EXPECT_EQ(verify_error(f), "");
  EXPECT_THAT(print(f), HasSubstr("%ti, scale13 = %s13, zero13 = %z13, g_idx13 = %g13, scale2 = "
                                  "%s2, zero2 = %z2 {"));
  EXPECT_EQ(operand_role(f.ops[0], 9), "zero2");
}

// MoeOptions' tensors as named operands: b13 [E, 2*I] / b2 [E, H] f32, a bf16
// shared expert [2*Is, H] / [H, Is] and shared_weights [T] f32, on bf16 and
// quantized experts; each misuse an error naming the operand.
TEST(IrMoeOptions, BiasesAndSharedExpert) {
  const std::string bias_params = "%b13: tensor<4x128xf32>, %b2: tensor<4x128xf32>";
  const std::string shared_params =
      "%s13w: tensor<96x128xbf16>, %s2w: tensor<128x48xbf16>, %sw: tensor<?Txf32>";
  const std::string all =
      "b13 = %b13, b2 = %b2, shared_w13 = %s13w, shared_w2 = %s2w, shared_weights = %sw";
  const std::vector<std::string> valid = {
      moe_quant_text("bf16", bias_params + ", " + shared_params, all, "{top_k = 2}"),
      moe_quant_text("bf16", shared_params,
                     "shared_w13 = %s13w, shared_w2 = %s2w, shared_weights = %sw", "{top_k = 2}"),
      moe_quant_text("f4e2m1", std::string(kMoeMxParams) + ", " + bias_params,
                     "scale13 = %s13, scale2 = %s2, b13 = %b13, b2 = %b2",
                     "{activation = \"clamped_swiglu\", glu_rows = \"interleaved\", top_k = 2}"),
  };
  for (const std::string& t : valid) {
    SCOPED_TRACE(t);
    const Function f = parse(t);
    EXPECT_EQ(verify_error(f), "");
    EXPECT_EQ(print(parse(print(f))), print(f));
  }
  struct Bad {
    std::string params, named, want;
  };
  const std::vector<Bad> bad = {
      {"%b13: tensor<4x127xf32>", "b13 = %b13",
       "operand 'b13' (%b13) has 2*I=127 but 'w13' (%w13) has 2*I=128"},
      {"%b13: tensor<4x128xbf16>", "b13 = %b13", "operand 'b13' (%b13) has dtype bf16"},
      {"%b2: tensor<3x128xf32>", "b2 = %b2", "operand 'b2' (%b2) has E=3 but 'w2' (%w2) has E=4"},
      {"%b2: tensor<128xf32>", "b2 = %b2", "operand 'b2' (%b2)"},
      {"%s13w: tensor<96x128xbf16>", "shared_w13 = %s13w",
       "operand 'shared_w13' (%s13w) without 'shared_w2': the shared expert takes both "
       "projections"},
      {"%sw: tensor<?Txf32>", "shared_weights = %sw",
       "operand 'shared_weights' (%sw) without a shared expert"},
      {"%s13w: tensor<96x128xbf16>, %s2w: tensor<128x40xbf16>",
       "shared_w13 = %s13w, shared_w2 = %s2w", "has 2*Is=96 and 'shared_w2' (%s2w) has Is=40"},
      {"%s13w: tensor<96x128xf8e4m3>, %s2w: tensor<128x48xf8e4m3>",
       "shared_w13 = %s13w, shared_w2 = %s2w", "operand 'shared_w13' (%s13w) has dtype f8e4m3"},
      {"%s13w: tensor<96x64xbf16>, %s2w: tensor<128x48xbf16>",
       "shared_w13 = %s13w, shared_w2 = %s2w", "operand 'shared_w13' (%s13w) has H=64"},
      {"%s13w: tensor<96x128xbf16>, %s2w: tensor<128x48xbf16>, %sw: tensor<7xf32>",
       "shared_w13 = %s13w, shared_w2 = %s2w, shared_weights = %sw",
       "operand 'shared_weights' (%sw) has T=7"},
  };
  for (const Bad& b : bad) {
    const std::string t = moe_quant_text("bf16", b.params, b.named, "{top_k = 2}");
    SCOPED_TRACE(t);
    EXPECT_THAT(verify_error(parse(t)), HasSubstr(b.want));
  }
}

TEST(IrQuantExperts, VerifierErrorsNameTheOperandOrAttribute) {
  struct Case {
    std::string wt, params, named, attrs, message;
  };
  const std::string i8n = "scale13 = %s13, scale2 = %s2";
  const std::string u4n =
      "scale13 = %s13, zero13 = %z13, g_idx13 = %g13, "
      "scale2 = %s2, zero2 = %z2";
  const std::string u4a = "{format = \"gptq\", group_size = 64, top_k = 2}";
  const std::vector<Case> cases = {
      // i8
      {"i8", "%s13: tensor<4x64xf32>, %s2: tensor<4x1xf32>", i8n, "{top_k = 2}",
       "operand 'scale13' (%s13) has shape [4, 64]; an i8 weight takes scale13 "
       "as f32 [E, N] "
       "(per channel, N=128) or [E, 1] (per tensor)"},
      {"i8", "%s13: tensor<3x128xf32>, %s2: tensor<4x1xf32>", i8n, "{top_k = 2}",
       "operand 'scale13' (%s13) has shape [3, 128]; its dim 0 is the expert "
       "count E=4"},
      {"i8", "%s13: tensor<4x128xf32>, %s2: tensor<4x64xf32>", i8n, "{top_k = 2}",
       "operand 'scale2' (%s2) has shape [4, 64]; an i8 weight takes scale2 as "
       "f32 [E, N] (per "
       "channel, N=128)"},
      {"i8", "%s13: tensor<4x128xf32>", "scale13 = %s13", "{top_k = 2}",
       "operand 'w2' (%w2) is i8: a quantized weight needs a 'scale2' operand"},
      {"i8", kMoeI8Params, i8n, "{act_quant = \"fixed\", top_k = 2}",
       "attribute 'act_quant' = \"fixed\" must be one of \"dynamic_sym\", "
       "\"dynamic_asym\""},
      {"i8", kMoeI8Params, i8n, "{act_scale = 0.5, top_k = 2}", "unknown attribute 'act_scale'"},
      {"i8", kMoeI8Params, i8n, "{group_size = 64, top_k = 2}",
       "attribute 'group_size' applies to u4 weights only; 'w13' (%w13) is i8"},
      {"i8", std::string(kMoeI8Params) + ", %z: tensor<4x1x128xu4>",
       "scale13 = %s13, zero13 = %z, scale2 = %s2", "{top_k = 2}",
       "operand 'zero13' (%z): an i8 weight has no zero point"},
      // f8e4m3
      {"f8e4m3", kMoeF8Params, i8n, "{top_k = 2}",
       "operand 'scale13' (%s13) has shape [4, 2, 2]: block scales need "
       "attributes 'block_n' and "
       "'block_k'"},
      {"f8e4m3", kMoeF8Params, i8n, "{block_k = 128, block_n = 64, top_k = 2}",
       "operand 'scale13' (%s13) has shape [4, 2, 2]; block scales of 64x128 "
       "over N=128, K=128 "
       "are f32 [4, 2, 1] [E, ceil(N/block_n), ceil(K/block_k)]"},
      {"f8e4m3", "%s13: tensor<4x128xf32>, %s2: tensor<4x128xf32>", i8n,
       "{block_k = 64, block_n = 64, top_k = 2}", "attribute 'block_n' needs block scales"},
      {"f8e4m3", std::string(kMoeF8Params) + ", %g: tensor<4x64xi32>",
       "scale13 = %s13, scale2 = %s2, g_idx2 = %g", "{block_k = 64, block_n = 64, top_k = 2}",
       "operand 'g_idx2' (%g): an f8e4m3 weight has no g_idx2"},
      // u4
      {"u4", kMoeU4Params, u4n, "{group_size = 64, top_k = 2}",
       "a u4 weight needs attribute 'format'"},
      {"u4", "%s13: tensor<4x2x128xf16>, %s2: tensor<4x1x128xf16>", i8n,
       "{format = \"gptq\", top_k = 2}",
       "operand 'scale13' (%s13) has shape [4, 2, 128]; a u4 weight of K=128 "
       "in groups of 128 "
       "takes scale13 as [E, G, N] = [4, 1, 128]"},
      {"u4",
       "%s13: tensor<4x2x128xf16>, %z13: tensor<4x2x64xu4>, %g13: "
       "tensor<4x128xi32>, "
       "%s2: tensor<4x1x128xf16>, %z2: tensor<4x1x128xu4>",
       u4n, u4a,
       "operand 'zero13' (%z13) has shape [4, 2, 64]; zero points are u4 [E, "
       "G, N] like "
       "'scale13' ([4, 2, 128])"},
      {"u4",
       "%s13: tensor<4x2x128xf16>, %z13: tensor<4x2x128xu4>, %g13: "
       "tensor<4x64xi32>, "
       "%s2: tensor<4x1x128xf16>, %z2: tensor<4x1x128xu4>",
       u4n, u4a, "operand 'g_idx13' (%g13) has shape [4, 64]; g_idx is i32 [E, K]"},
      {"u4", kMoeU4Params, u4n, "{format = \"gptq\", group_size = -2, top_k = 2}",
       "attribute 'group_size' = -2; allowed: a group size >= 1"},
      {"u4", kMoeU4Params, u4n, "{format = \"gptq\", group_size = 64, bits = 8, top_k = 2}",
       "attribute 'bits' = 8; allowed: 4"},
      {"u4", kMoeU4Params, u4n, "{block_k = 64, format = \"gptq\", group_size = 64, top_k = 2}",
       "attribute 'block_k' applies to f8e4m3 weights only; 'w13' (%w13) is "
       "u4"},
      // f4e2m1
      {"f4e2m1", "%s13: tensor<4x128x4xu8>, %s2: tensor<4x128x1xu8>", i8n, "{top_k = 2}",
       "operand 'scale2' (%s2) has shape [4, 128, 1]; an f4e2m1 weight of N=128, K=64 takes "
       "scale2 as its e8m0 exponents, u8 [E, N, ceil(K/32)] = [4, 128, 2]"},
      {"f4e2m1", kMoeMxParams, i8n, "{glu_rows = \"alternate\", top_k = 2}",
       "attribute 'glu_rows' = \"alternate\" must be one of \"halves\", \"interleaved\""},
      {"f4e2m1", kMoeMxParams, i8n, "{format = \"gptq\", top_k = 2}",
       "attribute 'format' applies to u4 weights only; 'w13' (%w13) is f4e2m1"},
      // bf16, mixed formats and the named operands themselves
      {"bf16", "%s13: tensor<4x128xf32>", "scale13 = %s13", "{top_k = 2}",
       "operand 'scale13' (%s13): bf16 experts take no 'scale13'"},
      {"i8", kMoeI8Params, "scale = %s13, scale2 = %s2", "{top_k = 2}",
       "%0 = moe: has no operand 'scale' (its named operands are scale13, zero13, g_idx13, "
       "scale2, zero2, g_idx2, b13, b2, shared_w13, shared_w2, shared_weights)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.wt + " | " + c.params + " | " + c.named + " | " + c.attrs);
    const std::string e = verify_error(moe_quant_text(c.wt, c.params, c.named, c.attrs));
    EXPECT_THAT(e, ::testing::StartsWith("%0 = moe: "));
    EXPECT_THAT(e, HasSubstr(c.message));
  }
  // w13 and w2 in different formats.
  std::string t = moe_quant_text("i8", kMoeI8Params, i8n, "{top_k = 2}");
  t.replace(t.find("4x128x64xi8"), 11, "4x128x64xf8e4m3");
  EXPECT_THAT(verify_error(t), HasSubstr("operand 'w2' (%w2) has dtype f8e4m3 but 'w13' (%w13) "
                                         "has i8: w13 and w2 are packed in one format"));
  // MXFP4 experts need their e8m0 exponents.
  EXPECT_THAT(verify_error(moe_quant_text("f4e2m1", "", "", "{top_k = 2}")),
              HasSubstr("operand 'w13' (%w13) is f4e2m1: a quantized weight needs a 'scale13' "
                        "operand"));
}

// ---- examples/*.tir ---------------------------------------------------------------

TEST(IrExamples, ParseAndVerify) {
#ifdef TILEJIT_EXAMPLES_DIR
  for (const char* file :
       {"linear_silu.tir", "linear_bias.tir", "gemm_int8.tir", "gemm_fp8_channel.tir",
        "gemm_fp8_block.tir", "gemm_int4_gptq.tir", "gemm_int4_awq.tir", "moe_silu.tir",
        "moe_int8.tir", "moe_fp8_block.tir", "moe_int4_gptq.tir", "gemm_mxfp4.tir", "moe_mxfp4.tir",
        "moe_shared_expert.tir", "attention_sinks.tir"}) {
    SCOPED_TRACE(file);
    std::string path = std::string(TILEJIT_EXAMPLES_DIR) + "/" + file;
    std::ifstream in(path);
    ASSERT_TRUE(in) << "cannot open " << path;
    std::stringstream ss;
    ss << in.rdbuf();
    Function f = parse(ss.str(), path);
    EXPECT_EQ(verify_error(f), "");
    EXPECT_EQ(print(parse(print(f))), print(f));
  }
#else
  GTEST_SKIP() << "TILEJIT_EXAMPLES_DIR is not defined";
#endif
}

}  // namespace
}  // namespace tilejit::ir
