import { describe, expect, it } from "vitest";
import { rpc } from "../src/lib/rpc";
import { FakeModel, f32View } from "./fakeModel";

describe("rpc", () => {
  it("sends a request and resolves with JSON and decoded arrays", async () => {
    const model = new FakeModel();
    model.respond = (req) => {
      // A stray answer to some other request must be ignored.
      queueMicrotask(() => model.emit("msg:custom", { type: "response", id: "other", ok: false, error: "x" }, []));
      return {
        msg: {
          type: "response",
          id: req.id,
          ok: true,
          result: { name: "fc1", total: 10 },
          arrays: {
            counts: { dtype: "float32", shape: [2, 2], buffer: 1 },
            edges: { dtype: "float32", shape: [3], buffer: 0 },
          },
        },
        buffers: [f32View([0, 0.5, 1], 5), f32View([1, 2, 3, 4], 8)],
      };
    };
    const ans = await rpc(model, "histogram", { row: 3 });
    expect(model.sent).toHaveLength(1);
    expect(model.sent[0].content).toMatchObject({ type: "request", method: "histogram", params: { row: 3 } });
    expect(ans.result).toEqual({ name: "fc1", total: 10 });
    expect(Array.from(ans.arrays.counts.data)).toEqual([1, 2, 3, 4]);
    expect(ans.arrays.counts.shape).toEqual([2, 2]);
    expect(Array.from(ans.arrays.edges.data)).toEqual([0, 0.5, 1]);
    expect(model.listenerCount()).toBe(0); // the one-shot listener is gone
  });

  it("uses distinct ids for concurrent requests", async () => {
    const model = new FakeModel();
    model.respond = (req) => ({ msg: { type: "response", id: req.id, ok: true, result: req.params.row, arrays: {} } });
    const [a, b] = await Promise.all([rpc(model, "m", { row: 1 }), rpc(model, "m", { row: 2 })]);
    expect([a.result, b.result]).toEqual([1, 2]);
    expect(model.sent[0].content.id).not.toBe(model.sent[1].content.id);
  });

  it("rejects with the kernel's error", async () => {
    const model = new FakeModel();
    model.respond = (req) => ({ msg: { type: "response", id: req.id, ok: false, error: "IndexError: row 99" } });
    await expect(rpc(model, "histogram", { row: 99 })).rejects.toThrow("IndexError: row 99");
    expect(model.listenerCount()).toBe(0);
  });

  it("rejects when a buffer is missing or nobody answers", async () => {
    const model = new FakeModel();
    model.respond = (req) => ({
      msg: { type: "response", id: req.id, ok: true, result: {}, arrays: { a: { dtype: "float32", shape: [1], buffer: 2 } } },
      buffers: [],
    });
    await expect(rpc(model, "h")).rejects.toThrow(/lacks buffer 2/);
    const bad = new FakeModel();
    bad.respond = (req) => ({
      msg: { type: "response", id: req.id, ok: true, result: {}, arrays: { a: { dtype: "float32", shape: [5], buffer: 0 } } },
      buffers: [f32View([1, 2], 1)],
    });
    await expect(rpc(bad, "h", {}, 1000)).rejects.toThrow(/needs 5 values, got 2/);
    expect(bad.listenerCount()).toBe(0);
    const silent = new FakeModel();
    await expect(rpc(silent, "h", {}, 20)).rejects.toThrow(/no answer to h/);
    expect(silent.listenerCount()).toBe(0);
  });
});
