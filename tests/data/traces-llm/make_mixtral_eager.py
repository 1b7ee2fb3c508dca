import torch, transformers, sys
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
impl=sys.argv[1]
cfg=transformers.MixtralConfig(vocab_size=32000,hidden_size=256,num_hidden_layers=2,num_attention_heads=8,
    num_key_value_heads=2,max_position_embeddings=1024,num_experts_per_tok=2,intermediate_size=512,num_local_experts=8,
    experts_implementation=impl)
m=transformers.MixtralForCausalLM(cfg); m.train()
print(m.config._experts_implementation)
opt=torch.optim.AdamW(m.parameters())
x=torch.randint(0,32000,(2,16))
with profile(activities=[ProfilerActivity.CPU],profile_memory=True,record_shapes=True,with_stack=True) as p:
    out=m(input_ids=x,labels=x); out.loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
p.export_chrome_trace(f"train_{impl}.json")
