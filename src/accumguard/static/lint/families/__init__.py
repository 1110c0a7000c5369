"""The lint rule families, one module each; importing this package registers every rule.

``window``     AG101 AG102 AG105   optimizer step / zero_grad / clipping inside the window;
               AG115 AG117         the boundary counter off by one; an epoch's leftover leaking on
``schedule``   AG103 AG114         LR scheduler stepped per micro-step or per process;
               AG119               ... or in a framework hook run on every micro-batch
``horizon``    AG124 AG125 AG360   the schedule's horizon counted in micro-batches, or per process
                                   for an Accelerate-prepared scheduler (Lightning's step
                                   interval under accumulate_grad_batches too), or times the
                                   processes under split_batches
``precision``  AG120 AG126 AG364   a model cast to bf16/fp16 accumulating its .grad (AG372: under the HF Trainer); FSDP2 bf16
                                   reduce_dtype with the sync deferred over the window; PEFT
                                   adapters kept in a bf16 base's dtype
``loss``       AG104 AG112 AG113   loss normalisation: mean of means, /W under DDP, rank means
``sync``       AG106 AG111         gradient-sync flags (DDP no_sync, FSDP2 set_requires_gradient_sync)
``reduce``     AG107 AG108         hand-written gradient all-reduce
``deepspeed``  AG109 AG110 AG2xx   engine gating vs. the config; config checks on dict literals
``accelerate`` AG121 AG128 AG171 AG176 the loss divided by K before accelerator.backward (divided twice);
               AG322 AG361 K without accumulate(); one accumulate() block running a whole
               window; a plain loss.backward() inside accumulate() (never divided by K);
               accumulate() with an Accelerator left at K = 1; zero_grad() on the raw
               optimizer inside accumulate()
``scale``      AG122 AG123         a mean loss backwarded K times, never divided by K; a loss
               divided by a count summed over ranks under DDP/FSDP's own average
``terms``      AG127               one loss term divided by K, another added undivided
``lrcounter``  AG130               a learning rate set by hand (or by a LambdaLR function that
                                   ignores its step) from a counter of micro-batches
``epochtail``  AG131               Lightning epochs (or their last window) shorter than K
``hfscale``    AG136               an HF compute_loss normalised by num_items_in_batch and divided by K;
               AG143               ... or never multiplied by the number of processes (G / W);
               AG118 AG174         ... or a per-micro-batch mean that ignores num_items_in_batch (x K when flagged scaled)
               AG343               ... or flagged not scaled while normalised by num_items_in_batch (/ K twice)
``hfterms``    AG142               an HF Trainer loss term that is a micro-batch mean beside a
                                   num_items_in_batch-normalised term, not divided by K
``fsdpunits``  AG156 AG181         an FSDP2 divide factor set on one unit of several; sync back on
                                   for the root only
``hfmean``     AG155               the stock HF Trainer, GA > 1, over a model whose loss is a plain mean
``hftokens``   AG140 AG190         HF TrainingArguments(average_tokens_across_devices=False) (F6);
                                   a get_batch_samples override returning an ungathered count
``tailscale``  AG141               the pass's partial last window stepped, its loss still divided by K
``moeaux``     AG132               HF Trainer + MoE model adding its router loss per micro-batch, GA > 1
``tokenmean``  AG129               a masked token mean per micro-batch, never divided by K;
               AG104               ... returned by a Lightning training_step, K > 1
``twice``      AG133               the loss divided by K in a helper and again by its caller;
               AG134               ... or by hand before DeepSpeed's engine.backward (GA > 1)
``ampclip``    AG135               gradient clipped before GradScaler.unscale_ (on the scaled gradient)
``hookclip``   AG138 AG319         clipping in a hook run on every micro-batch (Lightning's
                                   on_after_backward, HF on_substep_end, a parameter's gradient
                                   hook), K > 1; in HF on_step_begin
``syncclip``   AG105               clipping before the script's own all-reduce of the gradients
``hookreduce`` AG154               the accumulated .grad all-reduced (SUM) in a post-accumulate-grad hook
``dssched``    AG153               a scheduler given to deepspeed.initialize and stepped by the script too
``dsbatch``    AG152               a DeepSpeed train_batch_size of micro x K without the world size
``synctail``   AG151 AG178 AG342   a sync decided against K in windows that can be shorter; a step test wider than the sync;
               AG348               the leftover stepped (or, under FSDP2, thrown away) after a loop that synced at multiples of K only
``resume``     AG150               a checkpoint inside a window, resumed with its counter as saved
``hookgrad``   AG149 AG192 AG371   a gradient changed in HF's on_substep_end (never after the last micro-batch);
                                   zero_grad in a Lightning hook run on every batch; a TrainerCallback's own backward left in .grad
``fused``      AG137               an optimizer stepped in a post-accumulate-grad hook, loop accumulating
``tokhorizon`` AG145               an iteration horizon converted from tokens by one micro-batch's size
``factored``   AG146               a factor undoing the engine's averages multiplies an unnormalised term too
``lgmanual``   AG115               Lightning manual optimisation stepping on `batch_idx % K == 0`
``lgwindow``   AG144 AG173 AG365   a Lightning training_step divided by the window's count, or by K, /K again;
               AG369               a term added in a backward(loss) override, not /K; a term added to
                                   .grad in on_after_backward
``microstat``  AG147               a micro-batch's values whitened by its own statistics, K > 1
``prefetch``   AG148               a window drawn ahead of accelerator.accumulate with dataloader sync
``acctail``    AG157               Accelerate stepping a pass's short last window, its loss still /K
``emastep``    AG158               a weight average (EMA, momentum teacher) updated every micro-step
``commhook``   AG159 AG184         a DDP comm hook of the script's summing the bucket, never dividing;
                                   or dividing by W, then averaging again
``clipgrads``  AG160               a clip handed the gradients instead of the parameters
``accloader``  AG161               accelerator.accumulate() over a DataLoader prepare() never saw
``lgstep``     AG163 AG186         a manual-optimisation learning rate from global_step, N optimizers;
                                   an optimizer_step override gating the step Lightning gated
``unclearedopt`` AG165             an optimizer stepped at the boundary that nothing ever clears
``fsdproot``   AG166               FSDP2 applied to a model's submodules only, never to the model
``gradwrite``  AG167               .grad overwritten from autograd.grad on every micro-step
``wrapgate``   AG168 AG194 AG376   an optimizer wrapper that gates itself, gated again by the loop;
                                   a window hook stepping every K windows of the loop's own; a
                                   helper running a whole window, stepped every K calls
``dphorizon``  AG169 AG175 AG353   a horizon over the whole dataset a DistributedSampler splits, or over a rank's loader
                                   divided by the world size again
``hfclip``     AG177 AG182 AG370   a clip setting that never reaches TrainingArguments or DeepSpeed;
                                   clipping switched off by leaving max_grad_norm out
                                   (their default clip, 1.0)
``spawnworld`` AG170               WORLD_SIZE read (default 1) in ranks mp.spawn started
``dsstep``     AG188 AG349         a DeepSpeed engine's step() never called, its optimizer stepped; stepped after every
                                   backward of a hand window under no_sync with GA 1
``wrapbypass`` AG189 AG196 AG300   the training forward on the module a DDP wrapper was made from
               AG301               (or on `ddp.module`); a parameter unfrozen after DDP was built;
                                   a submodule replaced on the inner module after wrapping
``argdrop``    AG187 AG191 AG326 AG328 AG347 a command-line accumulation option filtered out before the config;
                                   an accumulation key parse_dict(allow_extra_keys=True) drops
``lowbuffer``  AG197               gradients folded into hand-made bf16/fp16 accumulation buffers
``stephorizon`` AG198 AG339        a count of optimizer steps multiplied (HF num_training_steps) or divided
                                   (Lightning estimated_stepping_batches) by K
``tempreduce`` AG199 AG352         a count all-reduced through a temporary copy (n.float()), or given to Lightning's
                                   strategy.reduce as a Python number
``lgkschedule`` AG302              a horizon from estimated_stepping_batches under a GradientAccumulationScheduler
``dsblocks``   AG303               a coalesce_grad_reduction() block per micro-step, the step after the loop
``hfsuper``    AG304 AG334 AG350   a Trainer.training_step or compute_loss override dropping num_items_in_batch, or dividing
               AG351 AG362         by the configured K, or by the Trainer's Accelerator's K (always 1); a term
                                   over num_items_in_batch added to super().compute_loss() without x W
``dsunmanaged`` AG305              managed_gradient_accumulation false under the step-every-micro-batch loop
``hfmodel``    AG306               a Trainer.compute_loss forward through self.model, not the model argument
``chunktail``  AG307               windows from chunked(loader, K), every loss divided by K
``tokiters``   AG308               nanoGPT's tokens_per_iter without the world size, sizing a schedule
``lgunsplit``  AG309               a Lightning schedule from a fresh train_dataloader()'s length on several devices
``dszero``     AG310               engine.zero_grad() on every micro-batch of a ZeRO-0/1 run that accumulates
``cliporder``  AG311               a boundary-gated clip before that micro-step's backward, the step after
``funcclip``   AG312               each micro-step's autograd.grad gradients clipped before they are summed
``hfwarmup``   AG313               a TrainingArguments warmup_steps/max_steps counted in one device's micro-batches
``hfsetters``  AG314               TrainingArguments.set_training() without K on arguments built with K > 1
``dslateflag`` AG315 AG329         DeepSpeed's boundary flag read after engine.step(), gating a scheduler; or a checkpoint
``probebackward`` AG316            a backward before the training loop, its gradient never cleared
``fracepoch`` AG317                a fractional epoch for a scheduler counted in two units
``resumeskip`` AG318 AG327 AG331 AG332 a resume at the saved counter + 1 that skips the saved iteration;
               a resume at the saved index of a micro-batch already trained
``lastpass``   AG320               a gradient list replaced per loop pass, reduced after the loop
``meancount``  AG321               a loss x world size over a count the ranks averaged
``fsdpfactor`` AG323 AG345         FSDP2's gradient divide factor set to K without the world size, or K x W beside a loss / K
``gatedclip``  AG324               a step helper clipping on every call, stepping on its boundary flag
``hfheld``     AG325               a module held on an HF Trainer subclass, outside its model, stepped
``coefstep``   AG330               a loss coefficient's controller updated on every micro-step
``handhorizon`` AG333             a hand-written schedule's horizon counted in micro-batches
``kworld``     AG335               the accumulation steps divided by the world size down to one
``hflossfunc`` AG336 AG338        an HF compute_loss_func that never reads num_items_in_batch, or multiplies by W
``acctwice``   AG340              a second Accelerator() after the training's, resetting K to 1
``fabricunset`` AG341             a module an optimizer steps that a data-parallel Fabric never set up
``plainheads`` AG344              modules an optimizer steps held in a plain dict or list under data parallelism
``lateunfreeze`` AG346            a parameter unfrozen after accelerator.prepare wrapped the model
``uncalled``   AG375               a boundary test naming a method without calling it (always true)
``droppedwrap`` AG377              the data-parallel wrapper made, then dropped before training
``accstep``    AG367               a learning rate computed from accelerator.step, Accelerate's micro-batch counter
``latemodule`` AG196 AG356 AG366  a submodule assigned to the model itself after DDP(...) wrapped it; a parameter or
                                   module made in a LightningModule's configure_optimizers under DDP;
                                   load_state_dict(assign=True) after the wrap
``hookcount`` AG354 AG355         a post-accumulate-grad hook scaling the running sum; a 1-based index tested with (i + 1) % K
``fabricbypass`` AG300             a submodule called through the model fabric.setup returned
``syncwhole``  AG111               every backward of the window inside one `with model.no_sync():`
``syncorder``  AG106 AG111         FSDP2's sync flag set after the backward; one no_sync() beside a conditional item
``unreduced``  AG179 AG180 AG183 AG337 parameters no reduction covers: one group of several all-reduced
               AG185 AG193 AG195   by hand; a module or bare parameter outside the DDP/FSDP wrapper;
                                   a generator of parameters spent before the write-back; a list
                                   of the trainable parameters built before an unfreeze; a copy
                                   of each gradient reduced and never written back; a loop
                                   variable rebound to the reduced value
``unregistered`` AG357 AG359 AG363 what the wrapper never registers: a tensor requiring a
                                   gradient that is not a parameter (a buffer, a plain attribute);
                                   trainable parameters in DDP's ignore list; only a submodule
                                   wrapped, in place
"""

from accumguard.static.lint.families import (
    accelerate,
    accloader,
    accstep,
    acctail,
    acctwice,
    ampclip,
    argdrop,
    chunktail,
    clipgrads,
    cliporder,
    coefstep,
    commhook,
    deepspeed,
    dphorizon,
    droppedwrap,
    dsbatch,
    dsblocks,
    dslateflag,
    dssched,
    dsstep,
    dsunmanaged,
    dszero,
    emastep,
    epochtail,
    fabricbypass,
    fabricunset,
    factored,
    fracepoch,
    fsdpfactor,
    fsdproot,
    fsdpunits,
    funcclip,
    fused,
    gatedclip,
    gradwrite,
    handhorizon,
    hfclip,
    hfheld,
    hflossfunc,
    hfmean,
    hfmodel,
    hfscale,
    hfsetters,
    hfsuper,
    hfterms,
    hftokens,
    hfwarmup,
    hookclip,
    hookcount,
    hookgrad,
    hookreduce,
    horizon,
    kworld,
    lastpass,
    latemodule,
    lateunfreeze,
    lgkschedule,
    lgmanual,
    lgstep,
    lgunsplit,
    lgwindow,
    loss,
    lowbuffer,
    lrcounter,
    meancount,
    microstat,
    moeaux,
    plainheads,
    precision,
    prefetch,
    probebackward,
    reduce,
    resume,
    resumeskip,
    scale,
    schedule,
    spawnworld,
    stephorizon,
    sync,
    syncclip,
    syncorder,
    synctail,
    syncwhole,
    tailscale,
    tempreduce,
    terms,
    tokenmean,
    tokhorizon,
    tokiters,
    twice,
    uncalled,
    unclearedopt,
    unreduced,
    unregistered,
    window,
    wrapbypass,
    wrapgate,
)

__all__ = ["accelerate", "accloader", "accstep", "acctwice", "acctail", "ampclip", "argdrop", "chunktail", "clipgrads", "cliporder", "coefstep", "commhook", "deepspeed", "dphorizon", "droppedwrap", "dsbatch", "dsblocks", "dslateflag", "dssched", "dsstep", "dsunmanaged", "dszero", "emastep", "epochtail", "fabricbypass", "fabricunset", "factored", "fracepoch", "fsdpfactor", "fsdproot", "funcclip", "fsdpunits", "fused", "gatedclip", "gradwrite", "hookclip", "hookgrad", "hookreduce", "hfmean", "kworld", "hfmodel", "hfclip", "hfheld", "hflossfunc", "hfscale", "hfsetters", "hfsuper", "hfterms", "hftokens", "handhorizon", "hfwarmup", "horizon", "lastpass", "lateunfreeze", "latemodule", "hookcount", "lgkschedule", "lgmanual", "lgstep", "lgunsplit", "lgwindow", "loss", "lowbuffer", "lrcounter", "meancount", "microstat", "moeaux", "plainheads", "precision", "prefetch", "probebackward", "reduce", "resume", "resumeskip", "scale", "schedule", "spawnworld", "stephorizon", "sync", "syncclip", "syncorder", "syncwhole", "synctail", "tailscale", "tempreduce", "terms", "tokenmean", "tokhorizon", "tokiters", "twice", "uncalled", "unclearedopt", "unreduced", "unregistered", "window", "wrapbypass", "wrapgate"]
