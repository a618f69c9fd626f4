//! What kvfast knows of llama.cpp's architectures, by GGUF arch name (`general.architecture`):
//! which memory each gets, which of its layers are recurrent, its sliding-window pattern and its
//! RoPE. Every table is here once; each names the llama.cpp source it follows.

/// Architectures llama.cpp gives a recurrent memory only (`llm_arch_is_recurrent`): the memory is
/// the recurrent part alone, every layer in it.
pub const RECURRENT: [&str; 6] = ["mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"];

/// Hybrids whose recurrent layers are those of no KV head (their `is_recr` rule).
pub const NO_KV_HEAD_IS_RECURRENT: [&str; 9] = [
    "jamba",
    "granitehybrid",
    "lfm2",
    "lfm2moe",
    "plamo2",
    "kimi-linear",
    "bailingmoe3",
    "kimi-k3",
    "glm5-next",
];

/// Hybrids whose recurrent layers are listed (`attention.recurrent_layers`), or all but every
/// `full_attention_interval`-th one.
pub const INTERVAL: [&str; 5] = ["qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"];

/// Falcon-H1 keeps every layer in both the attention caches and the recurrent part.
pub const FALCON_H1: &str = "falcon-h1";

/// Nemotron-H: a layer of no KV head and no feed-forward is recurrent, one of KV heads attention,
/// its MLP layers (a feed-forward, no KV head) are in neither.
pub const NEMOTRON_H: [&str; 2] = ["nemotron_h", "nemotron_h_moe"];

/// LFM2: with a sliding window, every attention layer slides (its `is_swa` rule).
pub const LFM2: [&str; 2] = ["lfm2", "lfm2moe"];

/// Hybrids kvfast knows no layer rule for (their recurrent layers are read from the bytes).
pub const OTHER_HYBRIDS: [&str; 1] = ["deepseek4"];

/// Architectures llama.cpp gives a hybrid memory, attention caches then a recurrent part
/// (`llm_arch_is_hybrid`).
pub const HYBRID: [&str; 18] = [
    "jamba",
    "falcon-h1",
    "plamo2",
    "granitehybrid",
    "lfm2",
    "lfm2moe",
    "nemotron_h",
    "nemotron_h_moe",
    "qwen3next",
    "kimi-linear",
    "bailingmoe3",
    "kimi-k3",
    "glm5-next",
    "qwen35",
    "qwen35moe",
    "qwen4exp",
    "deepseek4",
    "minimax-01",
];

/// GGUF keys (after `<arch>.`) of a recurrent layer's hyperparameters: a model with none keeps no
/// recurrent part, whatever its arch.
pub const RECURRENT_KEYS: [&str; 6] = [
    "ssm.",
    "shortconv.",
    "wkv.",
    "token_shift_count",
    "kda.",
    "linear_attention",
];

/// llama.cpp's hard-coded sliding-window patterns (`llama_hparams::set_swa_pattern(n)`): layer il
/// uses the sliding window when `il % n < n - 1`, i.e. every n-th layer is full attention.
pub const SWA_PATTERN: [(&str, u64); 6] = [
    ("gemma2", 2),
    ("gemma3", 6),
    ("gemma3n", 5),
    ("cohere2", 4),
    ("gpt-oss", 2),
    ("exaone4", 4),
];

/// NORM RoPE (neighbouring values paired): `llama_model_rope_type` (src/llama-model.cpp).
pub const NORM: [&str; 44] = [
    "arcee",
    "arctic",
    "baichuan",
    "bailingmoe",
    "chameleon",
    "chatglm",
    "cohere2",
    "cohere2moe",
    "command-r",
    "deci",
    "deepseek",
    "deepseek2",
    "deepseek2-ocr",
    "deepseek32",
    "deepseek4",
    "dots3note",
    "eagle3",
    "ernie4_5",
    "ernie4_5-moe",
    "glm-dsa",
    "granite",
    "granite_swa",
    "granitehybrid",
    "granitemoe",
    "graniteswitch",
    "hy_v4",
    "internlm2",
    "llada",
    "llama",
    "llama-embed",
    "llama4",
    "maincoder",
    "minicpm",
    "mistral3",
    "mistral4",
    "muse-glimmer",
    "nanbeige",
    "neo-bert",
    "olmo",
    "plm",
    "pockettts",
    "smollm3",
    "starcoder",
    "xverse",
];

/// NEOX RoPE (halves paired): `llama_model_rope_type` (src/llama-model.cpp).
pub const NEOX: [&str; 73] = [
    "afmoe",
    "apertus",
    "bailingmoe2",
    "bert",
    "bitnet",
    "codeshell",
    "cogvlm",
    "dbrx",
    "dots1",
    "dream",
    "eurobert",
    "exaone",
    "exaone-moe",
    "exaone4",
    "falcon",
    "falcon-h1",
    "gemma",
    "gemma-embedding",
    "gemma2",
    "gemma3",
    "gemma3n",
    "gemma4",
    "gemma4-assistant",
    "gpt-oss",
    "gptneox",
    "grok",
    "grovemoe",
    "hrm_text",
    "hunyuan-dense",
    "hunyuan-moe",
    "hy_v3",
    "jais2",
    "jina-bert-v3",
    "laguna",
    "lfm2",
    "lfm2moe",
    "llada-moe",
    "maple",
    "mellum",
    "mimo2",
    "minicpm3",
    "minimax-01",
    "minimax-m2",
    "minimax-m3",
    "modern-bert",
    "nemotron",
    "nomic-bert",
    "nomic-bert-moe",
    "olmo2",
    "olmoe",
    "openelm",
    "orion",
    "pangu-embedded",
    "phi2",
    "phi3",
    "phimoe",
    "plamo",
    "plamo2",
    "plamo3",
    "qwen",
    "qwen2",
    "qwen2moe",
    "qwen3",
    "qwen3moe",
    "qwen3next",
    "rnd1",
    "seed_oss",
    "smallthinker",
    "spark2_5",
    "stablelm",
    "starcoder2",
    "step35",
    "talkie",
];

/// NORM (false) or NEOX (true) unless the file carries M-RoPE sections
/// (`llama_model_rope_type`).
pub const MAYBE_MROPE: [(&str, bool); 4] = [
    ("bailingmoe3", false),
    ("glm4", false),
    ("glm4moe", true),
    ("hunyuan_vl", true),
];

/// M-RoPE (`LLAMA_ROPE_TYPE_MROPE`, `LLAMA_ROPE_TYPE_IMROPE`; `llama_model_rope_type`).
pub const MROPE: [&str; 9] = [
    "dflash",
    "paddleocr",
    "qwen2vl",
    "qwen35",
    "qwen35moe",
    "qwen3tts",
    "qwen3vl",
    "qwen3vlmoe",
    "qwen4exp",
];

/// Interleaved M-RoPE (`LLAMA_ROPE_TYPE_IMROPE`); the rest of [`MROPE`] has its sections in a row.
pub const IMROPE: [&str; 6] = [
    "qwen35",
    "qwen35moe",
    "qwen3tts",
    "qwen3vl",
    "qwen3vlmoe",
    "qwen4exp",
];

/// Archs whose K is [no-RoPE part, RoPE part] (a separately roped k_pe concatenated last: MLA and
/// its kin, src/models/*.cpp): the roped dimensions are the last ones, not undone yet.
pub const ROPE_LAST: [&str; 12] = [
    "bailingmoe3",
    "deepseek2",
    "deepseek2-ocr",
    "deepseek32",
    "deepseek4",
    "dots3note",
    "glm-dsa",
    "hy_v4",
    "kimi-k3",
    "kimi-linear",
    "minicpm3",
    "plm",
];

/// Archs whose loader sets the sliding-window base to the global one before reading
/// `rope.freq_base_swa` (src/llama-model.cpp, `load_hparams`); the others default it to 10000.
pub const SWA_BASE_IS_GLOBAL: [&str; 16] = [
    "afmoe",
    "cohere2",
    "cohere2moe",
    "dflash",
    "exaone-moe",
    "exaone4",
    "gemma2",
    "laguna",
    "llama4",
    "maple",
    "mellum",
    "muse-glimmer",
    "olmo2",
    "gpt-oss",
    "smallthinker",
    "spark2_5",
];

/// Whether llama.cpp gives `arch` a recurrent memory only (`llm_arch_is_recurrent`).
pub fn is_recurrent(arch: &str) -> bool {
    RECURRENT.contains(&arch)
}

/// Whether llama.cpp gives `arch` a hybrid memory (`llm_arch_is_hybrid`).
pub fn is_hybrid(arch: &str) -> bool {
    HYBRID.contains(&arch)
}

/// llama.cpp's hard-coded sliding-window pattern of `arch` (0: none).
pub fn swa_pattern(arch: &str) -> u64 {
    SWA_PATTERN
        .iter()
        .find(|(a, _)| *a == arch)
        .map_or(0, |(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hybrids_are_the_archs_with_a_layer_rule_and_the_rest() {
        let mut rules: Vec<&str> = NO_KV_HEAD_IS_RECURRENT
            .iter()
            .chain(&INTERVAL)
            .chain(&NEMOTRON_H)
            .chain(&OTHER_HYBRIDS)
            .copied()
            .chain([FALCON_H1])
            .collect();
        let mut hybrid = HYBRID.to_vec();
        rules.sort_unstable();
        hybrid.sort_unstable();
        assert_eq!(rules, hybrid);
        assert!(is_recurrent("mamba2") && !is_hybrid("mamba2"));
        assert!(is_hybrid("qwen35") && !is_recurrent("qwen35"));
    }

    #[test]
    fn no_arch_has_two_ropes() {
        for a in NORM {
            assert!(!NEOX.contains(&a) && !MROPE.contains(&a), "{a}");
        }
        assert!(IMROPE.iter().all(|a| MROPE.contains(a)));
        assert_eq!(swa_pattern("gemma3"), 6);
        assert_eq!(swa_pattern("qwen3"), 0);
    }
}
