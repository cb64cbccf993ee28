// Unit tests of the tokenizer building blocks, on small hand-made inputs (no shared data).
#include <gtest/gtest.h>

#include "emoe/core/error.h"
#include "emoe/tokenizer/added_tokens.h"
#include "emoe/tokenizer/byte_level.h"
#include "emoe/tokenizer/pipeline_tokenizer.h"
#include "emoe/tokenizer/sentencepiece.h"
#include "emoe/tokenizer/sentencepiece_proto.h"
#include "emoe/tokenizer/truncation.h"
#include "emoe/tokenizer/unicode.h"
#include "emoe/tokenizer/wordpiece.h"

namespace {

using Ids = std::vector<int64_t>;

Ids iota_ids(int64_t n, int64_t start) {
  Ids v;
  for (int64_t i = 0; i < n; ++i) v.push_back(start + i);
  return v;
}

TEST(TokenizerTruncation, LongestFirstLikeHuggingFace) {
  // 10 + 6 tokens and 3 specials into 12: remove 7; the longer loses 4 to reach 6, then the
  // remaining 3 are split 1 (first) / 2 (second).
  Ids a = iota_ids(10, 0), b = iota_ids(6, 100);
  emoe::truncate_longest_first(a, &b, 3, 12);
  EXPECT_EQ(a, iota_ids(5, 0));
  EXPECT_EQ(b, iota_ids(4, 100));
  // The second sequence longer: it gives up the difference and the larger half.
  Ids c = iota_ids(3, 0), d = iota_ids(9, 100);
  emoe::truncate_longest_first(c, &d, 3, 10);
  EXPECT_EQ(c, iota_ids(3, 0));
  EXPECT_EQ(d, iota_ids(4, 100));
  // A single sequence loses its tail; nothing changes when it fits.
  Ids e = iota_ids(10, 0);
  emoe::truncate_longest_first(e, nullptr, 2, 6);
  EXPECT_EQ(e, iota_ids(4, 0));
  emoe::truncate_longest_first(e, nullptr, 2, 6);
  EXPECT_EQ(e, iota_ids(4, 0));
  Ids f = iota_ids(4, 0);
  EXPECT_THROW(emoe::truncate_longest_first(f, nullptr, 2, 2), emoe::InputError);
}

TEST(TokenizerUnicode, ReplacementLikePython) {
  using emoe::unicode::sanitize_utf8;
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(sanitize_utf8("a\xE2\x82"), "a" + r);                    // truncated: one U+FFFD
  EXPECT_EQ(sanitize_utf8("\xC0\x80"), r + r);                       // overlong: each byte
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), r + r + r);               // surrogate: each byte
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98!"), r + "!");                // cut emoji: one
  EXPECT_EQ(sanitize_utf8("\xE2\x82\xAC\xFF"), "\xE2\x82\xAC" + r);  // euro, then a bad byte
}

TEST(TokenizerUnicode, CaseAndNormalisation) {
  using namespace emoe::unicode;
  EXPECT_EQ(encode_utf8(lower(decode_utf8("\xC4\xB0Z"))), "i\xCC\x87z");  // U+0130 -> i + dot
  EXPECT_EQ(encode_utf8(nfd(decode_utf8("\xC3\xA9"))), "e\xCC\x81");
  EXPECT_EQ(encode_utf8(nfc(decode_utf8("e\xCC\x81"))), "\xC3\xA9");
  EXPECT_EQ(py_lstrip("\x1f\xC2\xA0 x "), "x ");  // str.isspace includes U+001F and NBSP
}

TEST(TokenizerByteLevel, TableAndPretokenizer) {
  EXPECT_EQ(emoe::byte_to_unicode()[' '], 0x120u);   // "Ġ"
  EXPECT_EQ(emoe::byte_to_unicode()['\n'], 0x10Au);  // "Ċ"
  EXPECT_EQ(emoe::byte_to_unicode()['A'], static_cast<char32_t>('A'));
  std::string bytes;
  ASSERT_TRUE(emoe::byte_level_to_bytes(emoe::bytes_to_byte_level("h\xC3\xA9 \n"), bytes));
  EXPECT_EQ(bytes, "h\xC3\xA9 \n");
  using V = std::vector<std::string>;
  EXPECT_EQ(emoe::gpt2_pretokenize("  multiple   spaces  "),
            (V{" ", " multiple", "  ", " spaces", "  "}));
  EXPECT_EQ(emoe::gpt2_pretokenize("don't I'M we'll"),
            (V{"don", "'t", " I", "'", "M", " we", "'ll"}));
  EXPECT_EQ(emoe::gpt2_pretokenize("a\n\nb 42x!?"), (V{"a", "\n", "\n", "b", " 42", "x", "!?"}));
  EXPECT_EQ(emoe::gpt2_pretokenize("x\xC2\xA0y"), (V{"x", "\xC2\xA0", "y"}));  // NBSP is \s
}

TEST(TokenizerAddedTokens, StrippingFollowsTheFlags) {
  emoe::AddedToken plain{"<p>", 7, true, false, false, false, true};
  emoe::AddedToken keep{"<k>", 8, true, false, false, false, false};
  emoe::AddedToken left{"<l>", 9, true, true, false, false, false};
  emoe::AddedToken word{"<w>", 10, false, false, false, true, false};
  emoe::AddedTokenSplitter s({plain, keep, left, word}, false);
  auto texts = [&](const std::string& in) {
    std::vector<std::string> out;
    for (const emoe::TextSegment& seg : s.split(in))
      out.push_back(seg.id >= 0 ? "#" + std::to_string(seg.id) : seg.text);
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(texts("a <p> b"), (V{"a", "#7", "b"}));    // plain strings eat both sides
  EXPECT_EQ(texts("a <k> b"), (V{"a ", "#8", " b"}));  // AddedToken(lstrip=rstrip=False)
  EXPECT_EQ(texts("a <l> b"), (V{"a", "#9", " b"}));   // lstrip eats the left side only
  EXPECT_EQ(texts("a<w>b"), (V{"a<w>", "b"}));         // single_word: not a whole word
  EXPECT_EQ(texts("a <w> b"), (V{"a ", "#10", " b"}));
  emoe::AddedTokenSplitter lower({keep}, true);
  std::vector<emoe::TextSegment> segs = lower.split("AB<k>CD");
  ASSERT_EQ(segs.size(), 3u);
  EXPECT_EQ(segs[0].text, "ab");
  EXPECT_EQ(segs[1].id, 8);
  EXPECT_EQ(segs[2].text, "cd");
}

TEST(TokenizerCleanUp, TransformersRules) {
  EXPECT_EQ(emoe::clean_up_tokenization("hello , world ! it ' s i 'm do n't ."),
            "hello, world! it's i'm don't.");
}

TEST(TokenizerWordPiece, GreedyLongestMatch) {
  std::vector<std::string> vocab = {"[PAD]", "[UNK]",  "[CLS]", "[SEP]", "[MASK]", "un",
                                    "##aff", "##able", "world", "##s",   ",",      "hello"};
  emoe::SpecialTokenRoles roles;
  auto token = [](const char* s) {
    emoe::AddedToken t;
    t.content = s;
    t.plain_string = true;
    return t;
  };
  roles.unk = token("[UNK]");
  roles.cls = token("[CLS]");
  roles.sep = token("[SEP]");
  roles.pad = token("[PAD]");
  roles.mask = token("[MASK]");
  emoe::WordPieceOptions opt;
  opt.max_input_chars_per_word = 9;
  emoe::WordPieceTokenizer tok(vocab, opt, roles, {});
  EXPECT_EQ(tok.encode_plain("UnAffable Worlds,hello"), (Ids{5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(tok.encode_plain("unaffables"), (Ids{1}));  // 10 chars > 9
  EXPECT_EQ(tok.encode_plain("unx"), (Ids{1}));         // no piece for "##x"
  EXPECT_EQ(tok.encode_plain("hello[MASK] world"), (Ids{11, 4, 8}));
  emoe::Encoding pair = tok.encode_pair("hello", "world", true, 5);
  EXPECT_EQ(pair.ids, (Ids{2, 11, 3, 8, 3}));
  EXPECT_EQ(pair.token_type_ids, (Ids{0, 0, 0, 1, 1}));
  EXPECT_EQ(tok.decode({2, 5, 6, 7, 8, 9, 10, 11, 3}), "[CLS] unaffable worlds, hello [SEP]");
  EXPECT_EQ(tok.decode({2, 5, 6, 7, 3}, true), "unaffable");
  EXPECT_THROW(tok.decode({12}), emoe::InputError);
  EXPECT_EQ(tok.vocab_size(), 12);
}

TEST(TokenizerWordPiece, AddedTokensBeyondTheVocabulary) {
  std::vector<std::string> vocab = {"[UNK]", "[CLS]", "[SEP]", "hello", "world"};
  emoe::SpecialTokenRoles roles;
  for (auto [slot, name] : {std::pair{&roles.unk, "[UNK]"}, std::pair{&roles.cls, "[CLS]"},
                            std::pair{&roles.sep, "[SEP]"}, std::pair{&roles.mask, "[MASK]"}}) {
    emoe::AddedToken t;
    t.content = name;
    t.plain_string = true;
    *slot = t;
  }
  emoe::AddedToken extra;  // as added_tokens.json gives it: a plain string with a fixed id
  extra.content = "<new>";
  extra.id = 6;
  extra.special = false;
  extra.plain_string = true;
  emoe::WordPieceTokenizer tok(vocab, emoe::WordPieceOptions{}, roles, {extra});
  EXPECT_EQ(tok.special().mask, 7);  // [MASK] is missing from the vocabulary: the next free id
  EXPECT_EQ(tok.vocab_size(), 8);
  EXPECT_EQ(tok.encode_plain("Hello<new>world [MASK]"), (Ids{3, 6, 4, 7}));
  EXPECT_EQ(tok.id_to_token(6), "<new>");
  EXPECT_THROW(tok.id_to_token(5), emoe::InputError);  // an id nothing uses
  // Tokens outside the model vocabulary are decoded apart and joined with spaces.
  EXPECT_EQ(tok.decode({1, 3, 6, 4, 7, 2}), "[CLS] hello <new> world [MASK] [SEP]");
  EXPECT_EQ(tok.decode({1, 3, 6, 4, 7, 2}, true), "hello <new> world");
}

TEST(TokenizerSentencePiece, ModelProtoRoundTrip) {
  emoe::SpmModelSpec spec;
  spec.pieces = {{"<unk>", 0, 2},
                 {"<s>", 0, 3},
                 {"</s>", 0, 3},
                 {"\xE2\x96\x81", -1, 1},
                 {"a", -1, 1},
                 {"b", -1, 1},
                 {"\xE2\x96\x81"
                  "a",
                  -2, 1},
                 {"\xE2\x96\x81"
                  "ab",
                  -3, 1}};
  spec.remove_extra_whitespaces = false;
  auto model = emoe::SpmModel::from_serialized(emoe::serialize_sentencepiece_model(spec), "test");
  EXPECT_EQ(model->piece_size(), 8);
  EXPECT_EQ(model->piece_type(0), 2);
  EXPECT_EQ(model->piece_type(1), 3);
  EXPECT_EQ(model->bos_id(), 1);
  EXPECT_EQ(model->id_to_piece(7),
            "\xE2\x96\x81"
            "ab");
  EXPECT_EQ(model->piece_to_id("zz"), -1);
  EXPECT_EQ(model->encode("ab"), (std::vector<int>{7}));
  EXPECT_EQ(model->encode("ab  b"), (std::vector<int>{7, 3, 3, 5}));  // whitespace kept
  EXPECT_EQ(model->decode({7, 3, 3, 5}), "ab  b");
  EXPECT_THROW(emoe::SpmModel::from_serialized("\x0a\x03", "broken"), emoe::InputError);
}

}  // namespace
