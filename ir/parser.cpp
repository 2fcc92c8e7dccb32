// A recursive-descent parser over characters. The type syntax (tensor<?Mx4096xbf16>)
// is not token-friendly ('x' joins dims), so there is no separate lexer: each
// rule reads characters and skips whitespace and // comments between tokens.
#include "ir/parser.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <unordered_map>

#include "ir/text_util.h"

namespace tilejit::ir {

ParseError::ParseError(std::string_view file, int line, int col, std::string_view message)
    : Error(cat(file, ":", line, ":", col, ": error: ", message)),
      file_(file),
      line_(line),
      col_(col),
      detail_(message) {}

namespace {

struct Pos {
  int line = 1;
  int col = 1;
};

// Where a value is defined, for "redefinition" messages.
struct Def {
  int id;
  Pos pos;
};

class Parser {
 public:
  Parser(std::string_view text, std::string_view file) : text_(text), file_(file) {}

  Function function() {
    skip_ws();
    keyword("func");
    expect('@');
    f_.name = ident("a function name");
    expect('(');
    if (!accept(')')) {
      do {
        skip_ws();
        Pos p = here();
        std::string n = value_name();
        expect(':');
        define(n, p, type());
        f_.params.push_back(static_cast<int>(f_.values.size()) - 1);
      } while (accept(','));
      expect(')');
    }
    expect('-');
    expect('>');
    expect('(');
    std::vector<std::pair<TensorType, Pos>> declared;
    if (!accept(')')) {
      do {
        skip_ws();
        Pos p = here();
        declared.emplace_back(type(), p);
      } while (accept(','));
      expect(')');
    }
    expect('{');
    while (true) {
      skip_ws();
      if (peek() != '%') break;
      op_line();
    }
    Pos ret_pos = here();
    keyword("return");
    skip_ws();
    if (peek() == '%') {
      do {
        f_.results.push_back(use());
      } while (accept(','));
    }
    expect('}');
    skip_ws();
    if (!at_end()) fail(here(), cat("expected end of input after '}', got ", describe(peek())));

    if (declared.size() != f_.results.size()) {
      fail(ret_pos, cat("return gives ", f_.results.size(), " value(s) but @", f_.name,
                        " declares ", declared.size(), " result(s)"));
    }
    for (size_t i = 0; i < declared.size(); ++i) {
      const Value& v = f_.values[static_cast<size_t>(f_.results[i])];
      if (declared[i].first != v.type) {
        fail(declared[i].second, cat("result ", i, " is declared ", declared[i].first.str(),
                                     " but the returned %", v.name, " is ", v.type.str()));
      }
    }
    return std::move(f_);
  }

 private:
  // ---- characters -----------------------------------------------------------
  bool at_end() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }
  Pos here() const { return cur_; }
  void advance() {
    if (at_end()) return;
    if (text_[pos_] == '\n') {
      ++cur_.line;
      cur_.col = 1;
    } else {
      ++cur_.col;
    }
    ++pos_;
  }
  void skip_ws() {
    while (!at_end()) {
      char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        advance();
      } else if (c == '/' && peek(1) == '/') {
        while (!at_end() && peek() != '\n') advance();
      } else {
        break;
      }
    }
  }
  std::string describe(char c) const {
    if (at_end()) return "end of input";
    if (c >= 0x20 && c < 0x7f) return cat("'", c, "'");
    char buf[8];
    std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned char>(c));
    return cat("byte ", buf);
  }

  [[noreturn]] void fail(Pos p, const std::string& msg) const {
    throw ParseError(file_, p.line, p.col, msg);
  }

  // ---- tokens ----------------------------------------------------------------
  // Each token reader skips the whitespace in front of it.
  bool accept(char c) {
    skip_ws();
    if (at_end() || peek() != c) return false;
    advance();
    return true;
  }
  void expect(char c) {
    skip_ws();
    if (at_end() || peek() != c) fail(here(), cat("expected '", c, "', got ", describe(peek())));
    advance();
  }
  // Reads [A-Za-z0-9_]* without skipping whitespace first.
  std::string ident_chars() {
    size_t start = pos_;
    while (!at_end() && is_ident_char(peek())) advance();
    return std::string(text_.substr(start, pos_ - start));
  }
  std::string ident(const char* what) {
    skip_ws();
    Pos p = here();
    if (at_end() || !is_alpha(peek())) fail(p, cat("expected ", what, ", got ", describe(peek())));
    return ident_chars();
  }
  void keyword(const char* kw) {
    skip_ws();
    Pos p = here();
    std::string got = is_alpha(peek()) ? ident_chars() : "";
    if (got != kw) {
      fail(p, cat("expected '", kw, "', got ", got.empty() ? describe(peek()) : "'" + got + "'"));
    }
  }
  // '%' followed by a name (no space between).
  std::string value_name() {
    expect('%');
    Pos p = here();
    std::string n = ident_chars();
    if (n.empty()) fail(p, cat("expected a value name after '%', got ", describe(peek())));
    return n;
  }
  int64_t integer(const char* what) {
    skip_ws();
    Pos p = here();
    size_t start = pos_;
    if (peek() == '-') advance();
    while (is_digit(peek())) advance();
    std::string_view s = text_.substr(start, pos_ - start);
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || s == "-") fail(p, cat("expected ", what, ", got ", describe(peek())));
    if (ec != std::errc() || end != s.data() + s.size()) {
      fail(p, cat(what, " '", s, "' is out of range"));
    }
    return v;
  }

  // ---- names -----------------------------------------------------------------
  void define(const std::string& n, Pos p, TensorType t) {
    auto [it, fresh] = defs_.emplace(n, Def{static_cast<int>(f_.values.size()), p});
    if (!fresh) {
      fail(p, cat("redefinition of %", n, " (first defined at ", it->second.pos.line, ":",
                  it->second.pos.col, ")"));
    }
    f_.values.push_back(Value{it->second.id, n, std::move(t)});
  }
  int use() {
    skip_ws();
    Pos p = here();
    std::string n = value_name();
    auto it = defs_.find(n);
    if (it == defs_.end()) fail(p, cat("use of undefined value %", n));
    return it->second.id;
  }

  // ---- types -----------------------------------------------------------------
  TensorType type() {
    skip_ws();
    Pos start = here();
    keyword("tensor");
    expect('<');
    skip_ws();
    std::vector<Dim> dims;
    std::optional<DType> dtype;
    bool after_symbol = false;  // for a hint when a symbol ran into an 'x'
    while (true) {
      Pos p = here();
      if (is_alpha(peek())) {
        std::string s = ident_chars();
        dtype = dtype_from_name(s);
        if (!dtype) {
          fail(p, cat("unknown dtype '", s, "' (known: ", known_dtypes_text(), ")",
                      after_symbol ? "; note that dim symbols end at the first 'x'" : ""));
        }
        break;
      }
      if (is_digit(peek())) {
        dims.push_back(Dim::fixed(integer("a dim")));
        after_symbol = false;
      } else if (peek() == '?') {
        advance();
        // A symbol ends at the 'x' that separates it from the next dim.
        size_t begin = pos_;
        while (!at_end() && is_ident_char(peek()) && peek() != 'x') advance();
        std::string sym(text_.substr(begin, pos_ - begin));
        if (!is_identifier(sym)) fail(p, "expected a symbol name after '?' (as in ?M)");
        dims.push_back(Dim::sym(std::move(sym)));
        after_symbol = true;
      } else {
        fail(p, cat("expected a dim (4096 or ?M) or a dtype, got ", describe(peek())));
      }
      if (peek() != 'x') fail(here(), cat("expected 'x' after a dim, got ", describe(peek())));
      advance();
    }
    Layout layout;
    if (accept(',')) layout = this->layout();
    expect('>');
    try {
      return TensorType::make(*dtype, std::move(dims), std::move(layout));
    } catch (const Error& e) {
      fail(start, e.what());
    }
  }

  Layout layout() {
    skip_ws();
    Pos p = here();
    std::string kind = ident("a layout (strided<...> or packed<...>)");
    expect('<');
    try {
      if (kind == "strided") {
        expect('[');
        std::vector<Layout::Stride> strides;
        if (!accept(']')) {
          do {
            if (accept('?')) {
              strides.push_back(std::nullopt);
            } else {
              strides.push_back(integer("a stride (an integer or ?)"));
            }
          } while (accept(','));
          expect(']');
        }
        expect('>');
        return Layout::strided(std::move(strides));
      }
      if (kind == "packed") {
        std::string format = ident("a packed format name");
        std::vector<Layout::Param> params;
        while (accept(',')) {
          std::string n = ident("a format parameter name");
          expect('=');
          params.emplace_back(n, integer("a format parameter value"));
        }
        expect('>');
        return Layout::packed(std::move(format), std::move(params));
      }
    } catch (const ParseError&) {
      throw;
    } catch (const Error& e) {
      fail(p, e.what());
    }
    fail(p, cat("unknown layout '", kind, "' (strided<[...]> or packed<format, ...>)"));
  }

  // ---- ops -------------------------------------------------------------------
  void op_line() {
    Pos p = here();
    std::string result = value_name();
    expect('=');
    skip_ws();
    Pos kp = here();
    std::string kname = ident("an op name");
    std::optional<OpKind> kind = op_kind_from_name(kname);
    if (!kind) {
      std::string known = join(all_op_kinds(), ", ", [](OpKind k) { return name(k); });
      fail(kp, cat("unknown op '", kname, "' (known: ", known, ")"));
    }
    Op op;
    op.kind = *kind;
    skip_ws();
    if (peek() == '%' || is_alpha(peek())) {
      // Positional operands (%x), then named ones (scale = %s); the named
      // ones are kept in the op's canonical order (the verifier checks the
      // roles), so that equal ops print equally.
      std::vector<std::pair<std::string, int>> named;
      do {
        skip_ws();
        Pos np = here();
        if (is_alpha(peek())) {
          std::string role = ident_chars();
          for (const auto& [r, id] : named)
            if (r == role) fail(np, cat("operand '", role, "' given twice"));
          expect('=');
          named.emplace_back(role, use());
        } else {
          if (!named.empty())
            fail(np, "a positional operand after a named one (named operands come last)");
          op.operands.push_back(use());
        }
      } while (accept(','));
      auto roles = named_operand_roles(op.kind);
      auto rank = [&](const std::string& r) {
        size_t i = 0;
        while (i < roles.size() && r != roles[i]) ++i;
        return i;
      };
      std::stable_sort(named.begin(), named.end(), [&](const auto& a, const auto& b) {
        return rank(a.first) != rank(b.first) ? rank(a.first) < rank(b.first) : a.first < b.first;
      });
      for (auto& [r, id] : named) {
        op.operands.push_back(id);
        op.operand_names.push_back(r);
      }
    }
    skip_ws();
    if (peek() == '{') op.attrs = attrs();
    expect(':');
    TensorType t = type();
    define(result, p, std::move(t));
    op.result = static_cast<int>(f_.values.size()) - 1;
    f_.ops.push_back(std::move(op));
  }

  Attrs attrs() {
    expect('{');
    Attrs a;
    if (accept('}')) return a;
    do {
      skip_ws();
      Pos p = here();
      std::string n = ident("an attribute name");
      if (a.has(n)) fail(p, cat("attribute '", n, "' given twice"));
      expect('=');
      AttrValue v = attr_value();
      try {
        a.set(n, std::move(v));
      } catch (const Error& e) {
        fail(p, e.what());
      }
    } while (accept(','));
    expect('}');
    return a;
  }

  AttrValue attr_value() {
    skip_ws();
    Pos p = here();
    char c = peek();
    if (c == '"') return string_literal();
    if (c == '[') {
      advance();
      IntList l;
      if (!accept(']')) {
        do {
          l.push_back(integer("an integer"));
        } while (accept(','));
        expect(']');
      }
      return l;
    }
    if (c == '-' || is_digit(c)) return number();
    if (is_alpha(c)) {
      std::string s = ident_chars();
      if (s == "true") return true;
      if (s == "false") return false;
      if (auto t = dtype_from_name(s)) return *t;
      fail(p, cat("unknown attribute value '", s, "' (strings are quoted: \"", s, "\")"));
    }
    fail(p, cat("expected an attribute value, got ", describe(c)));
  }

  AttrValue number() {
    Pos p = here();
    size_t start = pos_;
    bool real = false;
    if (peek() == '-') advance();
    while (is_digit(peek())) advance();
    if (peek() == '.') {
      real = true;
      advance();
      while (is_digit(peek())) advance();
    }
    if (peek() == 'e' || peek() == 'E') {
      real = true;
      advance();
      if (peek() == '+' || peek() == '-') advance();
      while (is_digit(peek())) advance();
    }
    std::string_view s = text_.substr(start, pos_ - start);
    const char* b = s.data();
    const char* e = s.data() + s.size();
    if (real) {
      double d = 0;
      auto [end, ec] = std::from_chars(b, e, d);
      if (ec != std::errc() || end != e) fail(p, cat("bad number '", s, "'"));
      return d;
    }
    int64_t i = 0;
    auto [end, ec] = std::from_chars(b, e, i);
    if (ec == std::errc::result_out_of_range) fail(p, cat("integer '", s, "' is out of range"));
    if (ec != std::errc() || end != e) fail(p, cat("bad number '", s, "'"));
    return i;
  }

  void refuse_control_byte() {
    const auto c = static_cast<unsigned char>(peek());
    if (c < 0x20 || c == 0x7f)
      fail(here(), cat(describe(peek()), " in a string literal; allowed: printable characters"));
  }

  std::string string_literal() {
    Pos p = here();
    advance();  // the opening quote
    std::string s;
    while (true) {
      if (at_end() || peek() == '\n') fail(p, "unterminated string");
      // A NUL or other control byte would end or garble every message that
      // quotes the string (C strings stop at NUL): strings are printable text.
      refuse_control_byte();
      char c = peek();
      advance();
      if (c == '"') return s;
      if (c == '\\') {
        if (at_end()) fail(p, "unterminated string");
        refuse_control_byte();
        c = peek();
        if (c != '"' && c != '\\')
          fail(here(), cat("unknown escape '\\", c, "' (only \\\" and \\\\)"));
        advance();
      }
      s += c;
    }
  }

  std::string_view text_;
  std::string_view file_;
  size_t pos_ = 0;
  Pos cur_;
  Function f_;
  std::unordered_map<std::string, Def> defs_;
};

}  // namespace

Function parse(std::string_view text, std::string_view filename) {
  return Parser(text, filename).function();
}

}  // namespace tilejit::ir
