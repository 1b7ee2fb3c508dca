//! Tied weights: one tensor read by several modules. A trace has no tensor
//! identity, so this is decided by evidence where there is some (training:
//! one gradient per tensor) and by the library's convention otherwise.

use std::collections::BTreeMap;

use super::reads::{Found, ReadKind};

/// Hugging Face model types whose configuration ties the input and output
/// embeddings by default (`tie_word_embeddings=True`), from transformers 5.23
/// (every registered configuration class instantiated with its defaults).
pub const HF_TIED_MODEL_TYPES: &[&str] = &[
    "albert",
    "aya_vision",
    "bart",
    "bert",
    "bert_generation",
    "big_bird",
    "bigbird_pegasus",
    "biogpt",
    "blenderbot",
    "blenderbot_small",
    "blip",
    "blip_text_model",
    "bloom",
    "camembert",
    "canary",
    "cohere",
    "cohere2",
    "cohere2_moe",
    "cohere2_vision",
    "cohere_compass_text",
    "convbert",
    "cpmant",
    "csm",
    "ctrl",
    "d_fine",
    "dab_detr",
    "data2vec_text",
    "deberta",
    "deberta_v2",
    "deepseek_vl",
    "deepseek_vl_hybrid",
    "deformable_detr",
    "deimv2",
    "diffusion_gemma",
    "diffusion_gemma_text",
    "distilbert",
    "electra",
    "ernie",
    "ernie4_5",
    "ernie4_5_moe",
    "ernie4_5_vl_moe",
    "ernie4_5_vl_moe_text",
    "esm",
    "falcon",
    "falcon_mamba",
    "flaubert",
    "flava",
    "florence2",
    "fnet",
    "fun_asr_nano",
    "funnel",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gemma3n",
    "gemma3n_text",
    "gemma4",
    "gemma4_text",
    "gemma4_unified",
    "gemma4_unified_assistant",
    "gemma4_unified_text",
    "glmasr",
    "got_ocr2",
    "gpt2",
    "gpt_bigcode",
    "gpt_neo",
    "gpt_neox_japanese",
    "gpt_sw3",
    "granite_docling",
    "granite_docling_text",
    "granite_speech",
    "granite_speech5_ctc",
    "granite_speech_plus",
    "granite_swa",
    "grounding_dino",
    "gte",
    "hunyuan_vl",
    "hunyuan_vl_text",
    "hyperclovax_vision_v2",
    "ibert",
    "internvl",
    "janus",
    "jetmoe",
    "jina_embeddings_v3",
    "kimi_k25",
    "kosmos_2",
    "kosmos_2.5",
    "kosmos_2_5_text_model",
    "kosmos_2_text_model",
    "layoutlm",
    "led",
    "lfm2",
    "lfm2_moe",
    "lfm2_vl",
    "lfm3",
    "lfm3_vl",
    "lighton_ocr",
    "longformer",
    "longt5",
    "luke",
    "lxmert",
    "m2m_100",
    "mamba",
    "marian",
    "mbart",
    "megatron_bert",
    "mimi",
    "mimi_decoder",
    "mimi_encoder",
    "minicpm3",
    "minicpm_ocr",
    "mistral3",
    "mm_grounding_dino",
    "mobilebert",
    "modernbert",
    "modernbert_decoder",
    "moonshine",
    "moss_transcribe_diarize",
    "mpnet",
    "mpt",
    "mra",
    "mt5",
    "mvp",
    "neomme",
    "nllb_moe",
    "nomic_bert",
    "nystromformer",
    "openai_gpt",
    "opt",
    "ovis2",
    "paddleocr_vl",
    "paddleocr_vl_text",
    "paligemma",
    "pe_audio_video",
    "pegasus",
    "pegasus_x",
    "plbart",
    "pop2piano",
    "pp_chart2table",
    "pp_doclayout_v3",
    "pp_doclayout_v4",
    "prophetnet",
    "qwen2_5_omni_text",
    "qwen3_asr",
    "qwen3_vl_moe_text",
    "recurrent_gemma",
    "roberta",
    "roberta_prelayernorm",
    "roc_bert",
    "roformer",
    "rt_detr_v2",
    "sam",
    "sam_hq",
    "seamless_m4t",
    "seamless_m4t_v2",
    "shieldgemma2",
    "smollm3",
    "speech_to_text",
    "speecht5",
    "squeezebert",
    "starcoder2",
    "switch_transformers",
    "t5",
    "t5_gemma_module",
    "t5gemma",
    "t5gemma2",
    "t5gemma2_decoder",
    "t5gemma2_encoder",
    "t5gemma2_text",
    "tapas",
    "trocr",
    "udop",
    "umt5",
    "vaultgemma",
    "vilt",
    "visual_bert",
    "voxtral_realtime",
    "whisper",
    "xglm",
    "xlm",
    "xlm_roberta",
    "xlm_roberta_xl",
    "xlnet",
    "xmod",
    "yoso",
    "youtu",
    "zamba",
    "zamba2",
    "zaya",
];

/// How the word-embedding tie was decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TieEvidence {
    /// Training: AccumulateGrad ran this many times for the signature.
    Gradients(u32),
    /// Hugging Face `model_type` and whether it ties by default.
    HuggingFace { model_type: String, tied: bool },
    /// No module frames: counted once (a guess).
    NoFrames,
    /// Not a Hugging Face model: every module's weight counted (a guess).
    Separate,
}

/// A tie that removed reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tie {
    pub dims: Vec<i64>,
    pub dtype: Option<u32>,
    pub bytes_each: u64,
    pub reads: u32,
    pub kept: u32,
    pub evidence: TieEvidence,
}

/// Resolves the word-embedding tie on `found` (removing duplicates); `grads`
/// is the AccumulateGrad multiset (dims, dtype) → count.
pub fn resolve_word_embeddings(
    found: &mut Vec<Found>,
    grads: &BTreeMap<(Vec<i64>, Option<u32>), u32>,
    hf_model_type: Option<&str>,
    has_frames: bool,
) -> Option<Tie> {
    let is_param = |f: &Found| f.kind == ReadKind::Parameter;
    let word = found
        .iter()
        .filter(|f| is_param(f) && f.known_role && f.op == "aten::embedding" && f.arg == 0)
        .max_by_key(|f| f.bytes)?;
    let sig = (word.dims.clone(), word.dtype);
    let group: Vec<usize> = found
        .iter()
        .enumerate()
        .filter(|(_, f)| is_param(f) && (f.dims.clone(), f.dtype) == sig)
        .map(|(i, _)| i)
        .collect();
    if group.len() < 2 {
        return None;
    }
    let heads: Vec<usize> = group
        .iter()
        .copied()
        .filter(|&i| found.get(i).is_some_and(|f| f.op == "aten::linear"))
        .collect();
    let tables: Vec<usize> = group
        .iter()
        .copied()
        .filter(|&i| found.get(i).is_some_and(|f| f.op == "aten::embedding"))
        .collect();
    let n = group.len() as u32;
    let g = grads.get(&sig).copied().unwrap_or(0);
    let (kept, evidence) = if g >= 1 {
        (g.min(n), TieEvidence::Gradients(g))
    } else if let Some(model_type) = hf_model_type {
        let tied = HF_TIED_MODEL_TYPES.contains(&model_type.replace('-', "_").as_str());
        let kept = 1 + if tied { 0 } else { heads.len() as u32 };
        (
            kept.min(n),
            TieEvidence::HuggingFace {
                model_type: model_type.to_owned(),
                tied,
            },
        )
    } else if !has_frames {
        (1, TieEvidence::NoFrames)
    } else {
        (n, TieEvidence::Separate)
    };
    let drop = (n - kept) as usize;
    let bytes_each = group
        .first()
        .and_then(|&i| found.get(i))
        .map_or(0, |f| f.bytes);
    if drop > 0 {
        let order: Vec<usize> = heads.iter().chain(tables.iter().skip(1)).copied().collect();
        let mut remove: Vec<usize> = order.into_iter().take(drop).collect();
        remove.sort_unstable();
        for i in remove.into_iter().rev() {
            found.remove(i);
        }
    }
    Some(Tie {
        dims: sig.0,
        dtype: sig.1,
        bytes_each,
        reads: n,
        kept,
        evidence,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(op: &str, arg: u16, dims: &[i64]) -> Found {
        Found {
            instance: None,
            dims: dims.to_vec(),
            dtype: Some(1),
            bytes: dims.iter().product::<i64>().unsigned_abs() * 4,
            kind: ReadKind::Parameter,
            in_trace: false,
            block: None,
            known_role: true,
            op: op.to_owned(),
            arg,
            first_read: 0,
            last_read: 0,
        }
    }

    /// A GPT-2-like model: the word table and the output Linear share a
    /// signature; the position table does not.
    fn model() -> Vec<Found> {
        vec![
            read("aten::embedding", 0, &[100, 8]),
            read("aten::embedding", 0, &[16, 8]),
            read("aten::linear", 1, &[100, 8]),
        ]
    }

    #[test]
    fn gradients_decide_a_tie_exactly() {
        let mut found = model();
        let grads = BTreeMap::from([((vec![100, 8], Some(1)), 1)]);
        let tie = resolve_word_embeddings(&mut found, &grads, None, true).unwrap();
        assert_eq!((tie.reads, tie.kept), (2, 1));
        assert_eq!(tie.evidence, TieEvidence::Gradients(1));
        assert_eq!(found.len(), 2);
        // The table stays, the head goes.
        assert!(found.iter().all(|f| f.op == "aten::embedding"));
        // Two gradients: two tensors.
        let mut found = model();
        let grads = BTreeMap::from([((vec![100, 8], Some(1)), 2)]);
        resolve_word_embeddings(&mut found, &grads, None, true).unwrap();
        assert_eq!(found.len(), 3);
    }

    #[test]
    fn without_gradients_the_conventions_decide() {
        let none = BTreeMap::new();
        let mut found = model();
        let tie = resolve_word_embeddings(&mut found, &none, Some("gpt2"), true).unwrap();
        assert_eq!(tie.kept, 1);
        let mut found = model();
        let tie = resolve_word_embeddings(&mut found, &none, None, false).unwrap();
        assert_eq!((tie.kept, tie.evidence), (1, TieEvidence::NoFrames));
        let mut found = model();
        let tie = resolve_word_embeddings(&mut found, &none, None, true).unwrap();
        assert_eq!((tie.kept, tie.evidence), (2, TieEvidence::Separate));
        assert_eq!(found.len(), 3);
        // No second read of the signature: nothing to decide.
        let mut found = vec![read("aten::embedding", 0, &[100, 8])];
        assert!(resolve_word_embeddings(&mut found, &none, None, true).is_none());
    }
}
