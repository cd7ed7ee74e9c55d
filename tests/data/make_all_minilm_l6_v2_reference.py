"""Reference embeddings of sentence-transformers/all-MiniLM-L6-v2 from Hugging Face transformers (PyTorch), the
checkpoint authors' own stack: the model card's recipe (mean pooling over the attention mask, then L2 norm)."""
import json, sys
import torch, transformers
from transformers import AutoModel, AutoTokenizer

folder = sys.argv[1]
sentences = ["This is an example sentence", "Each sentence is converted", "A man is eating food.",
             "A man is eating a piece of bread.", "The new movie is awesome", "The cat sits outside"]
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModel.from_pretrained(folder).eval()
encoded = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")
with torch.no_grad():
    output = model(**encoded)[0]
mask = encoded["attention_mask"].unsqueeze(-1).float()
embeddings = (output * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
embeddings = torch.nn.functional.normalize(embeddings, p=2, dim=1)
payload = {"checkpoint": "sentence-transformers/all-MiniLM-L6-v2",
           "made_with": f"transformers {transformers.__version__}, torch {torch.__version__}",
           "recipe": "mean pooling over the attention mask, then L2 normalisation (the model card's)",
           "sentences": sentences,
           "token_ids": [ids[: int(m.sum())] for ids, m in zip(encoded["input_ids"].tolist(), encoded["attention_mask"])],
           "first_dimensions": [[round(v, 6) for v in row[:8]] for row in embeddings.tolist()],
           "cosine_similarities": [[round(v, 6) for v in row] for row in (embeddings @ embeddings.T).tolist()]}
print(json.dumps(payload, indent=1))
