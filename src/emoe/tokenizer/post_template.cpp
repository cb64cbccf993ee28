// Special-token templates (HF post-processors) applied to one or two id sequences.
#include "emoe/tokenizer/post_template.h"

#include "emoe/tokenizer/truncation.h"

namespace emoe {

namespace {
TemplateItem special(int64_t id, int64_t type_id) {
  return {TemplateItem::Kind::kSpecial, id, type_id};
}
TemplateItem sequence(TemplateItem::Kind kind, int64_t type_id) {
  return {kind, -1, type_id};
}
}  // namespace

PostTemplate PostTemplate::bert(int64_t cls, int64_t sep) {
  using K = TemplateItem::Kind;
  PostTemplate t;
  t.single = {special(cls, 0), sequence(K::kSequenceA, 0), special(sep, 0)};
  t.pair = {special(cls, 0), sequence(K::kSequenceA, 0), special(sep, 0),
            sequence(K::kSequenceB, 1), special(sep, 1)};
  return t;
}

PostTemplate PostTemplate::bos_eos(std::optional<int64_t> bos, std::optional<int64_t> eos) {
  using K = TemplateItem::Kind;
  PostTemplate t;
  for (int part = 0; part < 2; ++part) {
    std::vector<TemplateItem> items;
    if (bos) items.push_back(special(*bos, part));
    items.push_back(sequence(part == 0 ? K::kSequenceA : K::kSequenceB, part));
    if (eos) items.push_back(special(*eos, part));
    if (part == 0) t.single = items;
    t.pair.insert(t.pair.end(), items.begin(), items.end());
  }
  return t;
}

int64_t PostTemplate::num_special(bool is_pair) const {
  int64_t n = 0;
  for (const TemplateItem& item : is_pair ? pair : single)
    if (item.kind == TemplateItem::Kind::kSpecial) ++n;
  return n;
}

Encoding PostTemplate::apply(const std::vector<int64_t>& a, const std::vector<int64_t>* b) const {
  Encoding enc;
  for (const TemplateItem& item : b ? pair : single) {
    const std::vector<int64_t>* seq = nullptr;
    if (item.kind == TemplateItem::Kind::kSequenceA) seq = &a;
    if (item.kind == TemplateItem::Kind::kSequenceB) seq = b;
    if (seq) {
      enc.ids.insert(enc.ids.end(), seq->begin(), seq->end());
      enc.token_type_ids.insert(enc.token_type_ids.end(), seq->size(), item.type_id);
    } else {
      enc.ids.push_back(item.id);
      enc.token_type_ids.push_back(item.type_id);
    }
  }
  return enc;
}

Encoding PostTemplate::encode(std::vector<int64_t> a, std::vector<int64_t>* b,
                              bool add_special_tokens, int64_t max_length) const {
  if (max_length > 0)
    truncate_longest_first(a, b, add_special_tokens ? num_special(b != nullptr) : 0, max_length);
  if (add_special_tokens) return apply(a, b);
  // Without the template HF gives type id 0 to both sequences.
  Encoding enc;
  enc.ids = std::move(a);
  if (b) enc.ids.insert(enc.ids.end(), b->begin(), b->end());
  enc.token_type_ids.assign(enc.ids.size(), 0);
  return enc;
}

}  // namespace emoe
