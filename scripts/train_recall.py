"""Train the tiny associative-recall model shipped in kvlab/data/recall-tiny (run by hand, not by CI).

    python scripts/train_recall.py                                    # the shipped checkpoint
    python scripts/train_recall.py --steps 300 --out results/recall-try  # a quick try (will not learn yet)

A small Llama-family kvlab Decoder learns kvlab.experiments.recall: a context of key->value pairs, then
queries, each answered with its key's value. Training runs kvlab's own forward with a NoCache (the
full-sequence pass) and AdamW; the loss falls on the queries only (the key's digits and the answer),
since the context is random. Contexts start at 2-6 pairs and grow by 2 pairs whenever the running
answer accuracy reaches 90%, up to 16 (a curriculum). Expect a plateau: for about a thousand steps
the model answers with *some* value from the context, then it learns to look up the right one.

Everything is seeded: the same settings, torch version and thread count give the same weights. At
the end the script measures exact-match accuracy on held-out examples through kvlab.generate with
the exact (dynamic) cache and saves the model in transformers format (safetensors) with
training.json (settings, seed, steps, times, versions, accuracy) beside it. On one thread of the
2-core machine it was trained on, it took 11 CPU-minutes (see training.json for the figures).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import kvlab
from kvlab.cache import NoCache
from kvlab.model.config import ModelConfig
from kvlab.experiments.recall import NUM_KEYS, PAIR_TOKENS, QUERY_TOKENS, make_examples, score, training_batch

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "kvlab" / "data" / "recall-tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: on a busy 2-core machine a 2-thread step waits for its slower thread)")
    # model
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--max-positions", type=int, default=512)
    # data and optimisation
    p.add_argument("--steps", type=int, default=3500)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--min-pairs", type=int, default=2)
    p.add_argument("--max-pairs", type=int, default=16)
    p.add_argument("--start-pairs", type=int, default=6, help="the curriculum's largest context at first")
    p.add_argument("--pairs-step", type=int, default=2, help="how much the largest context grows at a time")
    p.add_argument("--advance-at", type=float, default=0.9,
                   help="grow contexts once the running answer accuracy reaches this")
    p.add_argument("--decay", type=float, default=0.25, help="fraction of final steps over which lr decays")
    p.add_argument("--queries", type=float, default=1.0, help="queries per context, as a fraction of its pairs")
    # evaluation
    p.add_argument("--eval-pairs", type=int, default=None, help="pairs per held-out context (default --max-pairs)")
    p.add_argument("--eval-examples", type=int, default=500)
    p.add_argument("--eval-seed", type=int, default=1000)
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args(argv)
    args.eval_pairs = args.eval_pairs or args.max_pairs
    if not 1 <= args.min_pairs <= args.start_pairs <= args.max_pairs <= NUM_KEYS:
        raise SystemExit(f"need 1 <= --min-pairs ({args.min_pairs}) <= --start-pairs ({args.start_pairs}) "
                         f"<= --max-pairs ({args.max_pairs}) <= {NUM_KEYS}")
    longest = PAIR_TOKENS * args.max_pairs + math.ceil(args.queries * args.max_pairs) * (QUERY_TOKENS + 4)
    if longest > args.max_positions:
        raise SystemExit(f"training sequences reach {longest} tokens but --max-positions is {args.max_positions}; "
                         "raise --max-positions or lower --max-pairs / --queries")
    return args


def model_config(args) -> ModelConfig:
    tok = kvlab.ByteTokenizer()
    return ModelConfig(arch="llama", vocab_size=tok.vocab_size, hidden_size=args.hidden, num_layers=args.layers,
                       num_heads=args.heads, num_kv_heads=args.kv_heads, intermediate_size=args.intermediate,
                       max_position_embeddings=args.max_positions, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, name="recall-tiny")


def lr_at(step: int, args) -> float:
    """Linear warmup, constant, then linear decay to a tenth of the peak over the last --decay of steps."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    start = int((1 - args.decay) * args.steps)
    if step < start:
        return args.lr
    return args.lr * (1 - 0.9 * (step - start) / max(1, args.steps - start))


def answer_accuracy(logits: torch.Tensor, targets: torch.Tensor, is_answer: torch.Tensor) -> float:
    """Fraction of queries whose every answer token is the argmax (= greedy gets it exactly right)."""
    hit = logits.argmax(-1) == targets  # (B, T)
    per_answer = hit[is_answer].view(-1, 4)  # (queries, 4): each answer is 4 consecutive tokens
    return float(per_answer.all(dim=1).float().mean())


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    config = model_config(args)
    model = kvlab.build_model(config, seed=args.seed, device="cpu").train()
    print(f"{config.name}: {model.num_parameters():,} parameters, {args.steps} steps, batch {args.batch}, "
          f"{args.threads} threads")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.98))
    no_cache = NoCache(config.num_layers, config.num_kv_heads, config.head_dim)
    # Curriculum: contexts of min..cap pairs; cap grows when the running accuracy says the model copes.
    cap, running, log, t0, c0 = args.start_pairs, 0.0, [], time.perf_counter(), time.process_time()
    for step in range(args.steps):
        P = rng.randint(args.min_pairs, cap)
        ids, targets, is_answer = training_batch(args.batch, P, max(1, round(args.queries * P)), rng)  # (B, T) each
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        logits = model(ids, no_cache)  # (B, T, V): the full-sequence forward, nothing cached
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        acc = answer_accuracy(logits.detach(), targets, is_answer)
        running = 0.9 * running + 0.1 * acc
        if running >= args.advance_at and cap < args.max_pairs:
            cap, running = min(args.max_pairs, cap + args.pairs_step), 0.0
        if step % args.log_every == 0 or step == args.steps - 1:
            log.append(dict(step=step, pairs=P, cap=cap, loss=round(loss.item(), 4), batch_accuracy=round(acc, 3),
                            running_accuracy=round(running, 3), elapsed_s=round(time.perf_counter() - t0, 1),
                            cpu_s=round(time.process_time() - c0, 1)))
            print(log[-1], flush=True)
    train_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0

    model.eval()
    held_out = make_examples(args.eval_examples, args.eval_pairs, seed=args.eval_seed)
    with torch.inference_mode():
        result = score(model, held_out, cache="dynamic")
    print(f"held-out exact-cache accuracy ({args.eval_examples} examples, {args.eval_pairs} pairs, "
          f"seed {args.eval_seed}): {result.accuracy:.3f}")
    print(result.by_distance.to_string(index=False))

    args.out.mkdir(parents=True, exist_ok=True)
    kvlab.to_transformers(model).save_pretrained(args.out, safe_serialization=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"}
    record = dict(
        task="kvlab.experiments.recall", script="scripts/train_recall.py", settings=settings, model=config.to_dict(),
        parameters=model.num_parameters(), train_seconds=round(train_s, 1), train_cpu_seconds=round(cpu_s, 1),
        final_pairs_cap=cap,
        torch=torch.__version__, kvlab=kvlab.__version__, threads=torch.get_num_threads(),
        held_out=dict(cache="dynamic", examples=args.eval_examples, num_pairs=args.eval_pairs,
                      seed=args.eval_seed, accuracy=result.accuracy,
                      by_distance=[dict(bucket=str(r.distance_bucket), examples=int(r.examples),
                                        accuracy=float(r.accuracy)) for r in result.by_distance.itertuples()]),
        log=log)
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved to {args.out} ({sum(f.stat().st_size for f in args.out.iterdir()) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
