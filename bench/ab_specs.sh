# The bench-spec methods both A/B scripts run (bench/run_cpu_ab.sh, bench/run_rev_ab.sh), as the
# array `specs` of --spec arguments: n-gram, the committed EAGLE head as a tree (with and without
# draft_p_min 0.5) and as a 2-token chain, the committed Medusa heads. Sourced; needs $here.
eagle="$here/models/heads/eagle-smollm2-135m.gguf"
medusa="$here/models/heads/medusa-smollm2-135m.gguf"
specs=(
  --spec '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":1,"prompt_lookup_max":5}'
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":8,\"eagle_topk\":4,\"eagle_depth\":4,\"draft_vocab_size\":8192}"
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":8,\"eagle_topk\":4,\"eagle_depth\":4,\"draft_vocab_size\":8192,\"draft_p_min\":0.5}"
  --spec "{\"method\":\"eagle\",\"model\":\"$eagle\",\"num_speculative_tokens\":2,\"eagle_topk\":1,\"eagle_depth\":2,\"draft_vocab_size\":8192}"
  --spec "{\"method\":\"medusa\",\"model\":\"$medusa\",\"num_speculative_tokens\":4,\"draft_vocab_size\":8192}"
)
