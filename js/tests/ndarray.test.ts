import { describe, expect, it } from "vitest";
import { decode, offset, typedArray } from "../src/lib/ndarray";

/** Bytes of `values` as little-endian float32, placed at `at` inside a larger buffer. */
function embedded(values: number[], at: number, total = at + values.length * 4 + 5): DataView {
  const buf = new ArrayBuffer(total);
  const dv = new DataView(buf, at, values.length * 4);
  values.forEach((v, i) => dv.setFloat32(i * 4, v, true));
  // Garbage around the window must not leak in.
  const all = new Uint8Array(buf);
  for (let i = 0; i < at; i++) all[i] = 0xff;
  for (let i = at + values.length * 4; i < total; i++) all[i] = 0xee;
  return dv;
}

describe("ndarray decode", () => {
  it("reads float32 at an aligned non-zero byteOffset without copying", () => {
    const dv = embedded([1.5, -2, 3.25, 4, 5, 6], 8);
    const a = decode({ view: dv, dtype: "float32", shape: [2, 3] });
    expect(Array.from(a.data)).toEqual([1.5, -2, 3.25, 4, 5, 6]);
    expect(a.shape).toEqual([2, 3]);
    expect(a.data.buffer).toBe(dv.buffer); // a view, not a copy
    expect(a.data.byteOffset).toBe(8);
  });

  it("copies when the byteOffset is not aligned to the element size", () => {
    const dv = embedded([0.5, NaN, -Infinity], 3);
    const a = decode({ view: dv, dtype: "float32", shape: [3] });
    expect(a.data[0]).toBe(0.5);
    expect(Number.isNaN(a.data[1])).toBe(true);
    expect(a.data[2]).toBe(-Infinity);
    expect(a.data.buffer).not.toBe(dv.buffer);
    expect(a.data.length).toBe(3);
  });

  it("decodes other dtypes and ArrayBuffers", () => {
    const buf = new ArrayBuffer(10);
    const dv = new DataView(buf, 2, 8);
    dv.setInt32(0, -7, true);
    dv.setInt32(4, 123456, true);
    expect(Array.from(decode({ view: dv, dtype: "int32", shape: [2] }).data)).toEqual([-7, 123456]);
    const u8 = new Uint8Array([1, 2, 3, 4]).buffer;
    expect(Array.from(decode({ view: u8, dtype: "uint8", shape: [2, 2] }).data)).toEqual([1, 2, 3, 4]);
    expect(Array.from(typedArray(new DataView(buf, 1, 2), "uint16"))).toHaveLength(1);
  });

  it("rejects a shape that does not match the byte count", () => {
    const dv = embedded([1, 2, 3], 4);
    expect(() => decode({ view: dv, dtype: "float32", shape: [2, 2] })).toThrow(/needs 4 values, got 3/);
    expect(() => typedArray(new DataView(new ArrayBuffer(7)), "float32")).toThrow(/whole number/);
    expect(() => typedArray(new ArrayBuffer(4), "float64" as any)).toThrow(/unsupported dtype/);
  });

  it("computes row-major offsets", () => {
    expect(offset([2, 3, 4], [1, 2, 3])).toBe(1 * 12 + 2 * 4 + 3);
    expect(offset([5], [4])).toBe(4);
  });
});
