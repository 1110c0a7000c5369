# corpus: style=hf class=F13
# HF-style custom loop: enumerate counts from 0 and the step follows the backward, so the
# optimizer steps after the very first batch (a window of 1), then every K.
from transformers import AutoModelForCausalLM, get_linear_schedule_with_warmup


def main(args, train_dataloader):
    model = AutoModelForCausalLM.from_config(args.config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, 100, args.max_steps)
    for epoch in range(args.num_train_epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            outputs = model(**batch)
            loss = outputs.loss / args.gradient_accumulation_steps
            loss.backward()
            if step % args.gradient_accumulation_steps == 0:  # expect: AG115
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
