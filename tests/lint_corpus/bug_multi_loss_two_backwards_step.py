# corpus: style=multi_loss class=F1b
accum_steps = 4
for i, batch in enumerate(loader):
    feats = backbone(batch.x)
    aux_loss = aux_head(feats).mean() / accum_steps
    aux_loss.backward(retain_graph=True)
    main_loss = main_head(feats, batch.y) / accum_steps
    main_loss.backward()
    optim.step()  # expect: AG101
    if (i + 1) % accum_steps == 0:
        optim.zero_grad()
