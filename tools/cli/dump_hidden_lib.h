// specserve tools: `specserve dump-hidden` — self-distillation data for Medusa / EAGLE heads.
//
// The target generates its own greedy continuation of every prompt (spec::Engine, continuous
// batching, no speculation) and the final-norm hidden state of every position it computes
// (prefill rows and decoded tokens; what the output head multiplies) is recorded as it goes:
// the engine hands them to a proposer that asks for every computed hidden state and never
// drafts (Proposer::needs_hidden, needs_every_hidden_row), so no second, teacher-forced pass is
// run. Per position it writes the hidden state, the token id and the target's argmax next token. Medusa (Cai et al. 2024,
// "Medusa-1": heads on a frozen target) and EAGLE (Li et al. 2024) train on exactly these
// features. tools/train/ reads the files. The backend is batch-invariant, so the rows equal a
// teacher-forced forward pass over the same tokens (tests/tools/dump_hidden_test.cpp checks it).
//
// Output directory (NumPy .npy v1.0, little-endian, C order):
//   hidden.npy   [num_positions, hidden_size] float16  final-norm hidden state at each position
//   tokens.npy   [num_positions] int32                  token id at each position
//   argmax.npy   [num_positions] int32                  argmax of the target's logits there (next token)
//   head.npy     [vocab_size, hidden_size] float32      the output head, dequantized (tied: = embedding)
//   embed.npy    [vocab_size, hidden_size] float32      the token embedding, dequantized
//   index.json   sequences (offset, length, prompt_length, generated, line, finish), shapes,
//                target_fingerprint, weights (head.npy / embed.npy written), num_prompts_skipped,
//                num_prompts_empty, ...
// Positions of sequence i are rows [offset_i, offset_i + length_i); its first prompt_length_i are
// the prompt (chat template applied), the rest the target's greedy continuation. Every position
// whose hidden state the target computed is recorded, so the only generated token left out is
// the last one of a sequence that ended on max_new_tokens (finish "length": length =
// prompt_length + generated - 1; its hidden state is never computed), and argmax at its last
// position is that token. After an end-of-generation token (finish "stop": length =
// prompt_length + generated; the stop token is not part of the output) argmax at the last
// position is the stop token.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model_loader.h"

namespace specserve::cli {

/// What to dump and how.
struct DumpHiddenOptions {
  /// JSONL, one prompt per line: {"messages": [{"role", "content"}, ...]} (chat template applied;
  /// roles system, developer (= system), user, assistant) or {"prompt": "..."} (raw text), not both.
  /// "task" (a label, as tools/train/make_prompts.py writes) is allowed and ignored; any other key
  /// is ignored with one warning (DumpHiddenSummary::warnings) naming the first line and key.
  /// Blank lines are ignored; an empty prompt (no text) is skipped and reported
  /// (num_prompts_empty, first_empty_prompt_line).
  std::string prompts_path;
  /// Created with its missing parents. The dump is written into a temporary directory inside it
  /// and moved into place only when complete (a previous dump's index.json is removed first), so
  /// a dump with an index.json is always whole; other files there are left alone. A failed dump
  /// removes what it created (the temporary directory; the output directory and the parents it
  /// created). The temporary directories that dumps killed outright left there
  /// (.dump-hidden.partial-HOST-PID of a process of this host no longer alive) are removed when
  /// a dump starts.
  std::string out_dir;
  int32_t max_new_tokens = 96;      ///< greedy continuation length cap per prompt, >= 1 (EOS may end it sooner)
  int32_t max_num_seqs = 24;        ///< sequences generated at once (Engine batch)
  int32_t max_prompts = 0;          ///< 0: all lines of the file; else the first N usable prompts
  int32_t max_prompt_tokens = 384;  ///< longer prompts are skipped (counted in num_prompts_too_long)
  /// Continuation rows: their argmax is the token generated next (greedy), so the output head
  /// runs only on prompt rows and on every `check_every`-th continuation row, whose argmax is
  /// compared with the generated token (num_argmax_mismatches; 1: every row, the slowest and
  /// most thorough). Logit rows cost a vocab x hidden GEMM each.
  int32_t check_every = 8;
  bool write_weights = true;        ///< also write head.npy and embed.npy (false: a previous dump's are removed)
  /// When set and true (a SIGINT/SIGTERM handler sets it), the dump stops at the next engine
  /// step (or before its files move into place) and fails with kCancelled, removing what it
  /// created as any failure does.
  const std::atomic<bool>* stop = nullptr;
};

/// What a dump produced.
struct DumpHiddenSummary {
  int64_t num_sequences = 0;
  int64_t num_positions = 0;
  int64_t num_generated = 0;       ///< recorded continuation tokens over all sequences
  /// Continuation positions whose teacher-forced argmax differs from the token generated next
  /// (0 when generation and teacher forcing agree, as batch invariance promises); after a stop
  /// token, a last position whose argmax is not an end-of-generation token.
  int64_t num_argmax_mismatches = 0;
  int64_t num_argmax_checked = 0;  ///< continuation positions whose argmax was computed and compared
  int64_t num_sequences_unrecorded = 0;  ///< no position handed over by the engine (not expected): left out
  int64_t num_prompts_skipped = 0;       ///< num_prompts_too_long + num_prompts_empty
  int64_t num_prompts_too_long = 0;      ///< over max_prompt_tokens
  int64_t num_prompts_empty = 0;         ///< no text (or no token after encoding)
  int64_t first_empty_prompt_line = 0;   ///< 1-based line of the first empty prompt; 0: none
  std::vector<std::string> warnings;     ///< also sent to the progress callback as they arise
  double generate_seconds = 0;     ///< the whole generation, recording included
  double head_seconds = 0;         ///< of which: recording and the output head on prompt and checked rows
  std::string target_fingerprint;  ///< 16 hex digits of model_fingerprint() of the target
};

/// Called with a one-line progress message ("generate 40/300 prompts ...") or a warning
/// ("warning: ..."; final_line true); may be empty.
using DumpProgress = std::function<void(const std::string& line, bool final_line)>;

/// Checks the options and paths without touching the filesystem (the CLI calls it before
/// loading the model). Errors, all kInvalidArgument naming the flag and value: an option out of
/// range; --prompts empty, missing (kNotFound) or a directory; --out empty, or an existing
/// non-directory (or one below a file).
Status check_dump_options(const DumpHiddenOptions& opts);

/// Runs the dump (see the file comment) with the loaded target. Errors: those of
/// check_dump_options; kInvalidArgument when --out cannot be created or written (naming it and
/// the path), for a JSONL line that is not an object with "messages" or "prompt" (or has both),
/// a bad message, an unknown role (naming the line), and when no prompt is usable; chat template
/// errors; engine and forward errors; kInternal when an output file cannot be written or moved
/// into place.
Expected<DumpHiddenSummary> dump_hidden(LoadedModel& lm, const DumpHiddenOptions& opts, const DumpProgress& progress = {});

/// "%016llx" of model_fingerprint(file): the string heads carry as `<arch>.target_fingerprint`.
std::string fingerprint_hex(const GgufFile& file);

/// Writes a .npy v1.0 file: `descr` is the NumPy type string ("<f2", "<f4", "<i4"), `shape`
/// the array's shape, `data` its bytes in C order. Errors: kInternal naming the path.
Status write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape, const void* data,
                 size_t num_bytes);

/// Reads a .npy v1.0/2.0 file written as above (C order). Fills *descr, *shape and *bytes.
/// Errors: kNotFound, kCorruptData (bad magic, header or size) naming the path.
Status read_npy(const std::string& path, std::string* descr, std::vector<int64_t>* shape, std::vector<uint8_t>* bytes);

/// IEEE half <-> float (round to nearest even; used for hidden.npy).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);

}  // namespace specserve::cli
