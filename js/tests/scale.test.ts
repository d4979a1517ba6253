import { describe, expect, it } from "vitest";
import { linear, log, niceTicks, symlog, symlogTransform } from "../src/lib/scale";

describe("linear", () => {
  it("maps, inverts and clamps", () => {
    const s = linear([-2, 6], [0, 100]);
    expect(s(-2)).toBe(0);
    expect(s(6)).toBe(100);
    expect(s(0)).toBe(25);
    expect(s(10)).toBe(150);
    expect(s.clamped(10)).toBe(100);
    expect(s.clamped(-100)).toBe(0);
    expect(s.invert(75)).toBe(4);
    expect(s.domain).toEqual([-2, 6]);
  });
  it("handles reversed ranges, degenerate domains and NaN", () => {
    const r = linear([0, 10], [100, 0]);
    expect(r(2)).toBe(80);
    expect(r.clamped(20)).toBe(0);
    const d = linear([3, 3], [0, 100]);
    expect(d(3)).toBe(50);
    expect(d(1000)).toBe(50);
    expect(d.invert(10)).toBe(3);
    expect(d.ticks(5)).toEqual([3]);
    expect(Number.isNaN(linear([0, 1], [0, 1])(NaN))).toBe(true);
    expect(Number.isNaN(linear([0, 1], [0, 1]).invert(NaN))).toBe(true);
    expect(Number.isNaN(linear([NaN, 1], [0, 1])(0.5))).toBe(true);
  });
  it("gives round ticks", () => {
    expect(linear([0, 1], [0, 1]).ticks(5)).toEqual([0, 0.2, 0.4, 0.6, 0.8, 1]);
    expect(niceTicks(-3, 7, 5)).toEqual([-2, 0, 2, 4, 6]);
    expect(niceTicks(0.1, 0.35, 5)).toEqual([0.1, 0.15, 0.2, 0.25, 0.3, 0.35]);
  });
});

describe("symlog", () => {
  it("is sign(x)·log10(1+|x|/c) mapped linearly", () => {
    expect(symlogTransform(9)).toBeCloseTo(1, 12);
    expect(symlogTransform(-99)).toBeCloseTo(-2, 12);
    expect(symlogTransform(0.5, 0.5)).toBeCloseTo(Math.log10(2), 12);
    const s = symlog([-99, 99], [0, 400]);
    expect(s(0)).toBeCloseTo(200, 9);
    expect(s(9)).toBeCloseTo(300, 9);
    expect(s(-9)).toBeCloseTo(100, 9);
    expect(s(99)).toBeCloseTo(400, 9);
    const t = symlog([0, 999], [0, 3], 1);
    expect(t(9)).toBeCloseTo(1, 12);
    expect(t(99)).toBeCloseTo(2, 12);
  });
  it("inverts", () => {
    const s = symlog([-1e6, 1e3], [10, 310], 1e-3);
    for (const x of [-1e6, -12.5, -1e-4, 0, 3e-3, 0.7, 1e3]) {
      expect(s.invert(s(x))).toBeCloseTo(x, Math.max(0, 6 - Math.ceil(Math.log10(Math.abs(x) + 1))));
      expect(Math.abs(s.invert(s(x)) - x)).toBeLessThan(1e-9 * Math.max(1, Math.abs(x)));
    }
  });
  it("handles NaN, infinities and degenerate domains", () => {
    const s = symlog([0, 100], [0, 1]);
    expect(Number.isNaN(s(NaN))).toBe(true);
    expect(Number.isNaN(s.invert(NaN))).toBe(true);
    expect(s(Infinity)).toBe(Infinity);
    expect(s.clamped(Infinity)).toBe(1);
    expect(s.clamped(-Infinity)).toBe(0);
    const d = symlog([0, 0], [0, 10]);
    expect(d(0)).toBe(5);
    expect(d(123)).toBe(5);
    expect(Number.isNaN(symlog([NaN, NaN], [0, 10])(1))).toBe(true);
  });
  it("ticks at 0 and powers of ten", () => {
    expect(symlog([-100, 1000], [0, 1]).ticks(10)).toEqual([-100, -10, -1, 0, 1, 10, 100, 1000]);
    const many = symlog([-1e12, 1e12], [0, 1]).ticks(4);
    expect(many).toContain(0);
    expect(many.length).toBeLessThanOrEqual(7);
    expect(many).toEqual([...many].sort((a, b) => a - b));
    // inside the linear region: falls back to linear ticks
    expect(symlog([0.1, 0.5], [0, 1]).ticks(4)).toEqual([0.1, 0.2, 0.3, 0.4, 0.5]);
  });
});

describe("log", () => {
  it("maps decades evenly and rejects non-positive values", () => {
    const s = log([1e-3, 10], [0, 4]);
    expect(s(1e-3)).toBeCloseTo(0, 12);
    expect(s(1)).toBeCloseTo(3, 12);
    expect(s.invert(2)).toBeCloseTo(0.1, 12);
    expect(Number.isNaN(s(0))).toBe(true);
    expect(Number.isNaN(s(-1))).toBe(true);
    expect(s.ticks(10)).toEqual([0.001, 0.01, 0.1, 1, 10]);
  });
});
