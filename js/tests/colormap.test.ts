import { describe, expect, it } from "vitest";
import { COLORMAPS, applyLut, colorAt, cssColor, lut, paintU8 } from "../src/lib/colormap";

// Reference entries of matplotlib 3.11's 256-entry tables (round(cmap(i) * 255)).
const REF: Record<string, Record<number, [number, number, number]>> = {
  viridis: { 0: [68, 1, 84], 37: [70, 51, 127], 64: [59, 82, 139], 101: [42, 119, 142], 128: [33, 145, 140], 170: [53, 183, 121], 203: [119, 209, 83], 255: [253, 231, 37] },
  magma: { 0: [0, 0, 4], 37: [36, 18, 83], 64: [81, 18, 124], 101: [139, 41, 129], 128: [183, 55, 121], 170: [241, 96, 93], 203: [254, 157, 108], 255: [252, 253, 191] },
  inferno: { 0: [0, 0, 4], 37: [41, 11, 85], 64: [87, 16, 110], 101: [146, 37, 104], 128: [188, 55, 84], 170: [237, 105, 37], 203: [252, 163, 9], 255: [252, 255, 164] },
  plasma: { 0: [13, 8, 135], 37: [85, 2, 164], 64: [126, 3, 168], 101: [176, 41, 145], 128: [204, 71, 120], 170: [237, 121, 83], 203: [252, 165, 55], 255: [240, 249, 33] },
  gray: { 0: [0, 0, 0], 64: [64, 64, 64], 128: [128, 128, 128], 255: [255, 255, 255] },
  coolwarm: { 0: [59, 76, 192], 37: [104, 138, 239], 64: [141, 176, 254], 101: [191, 211, 246], 128: [221, 220, 220], 170: [247, 184, 156], 203: [238, 134, 105], 255: [180, 4, 38] },
  RdBu: { 0: [103, 0, 31], 37: [194, 56, 58], 64: [229, 131, 104], 101: [253, 217, 196], 128: [246, 247, 247], 170: [167, 208, 228], 203: [70, 149, 196], 255: [5, 48, 97] },
};

/** Relative luminance-ish lightness (Rec. 709 weights on sRGB values). */
const light = ([r, g, b]: number[]) => 0.2126 * r + 0.7152 * g + 0.0722 * b;

describe("colormap", () => {
  it("lists the maps and builds 256×RGBA opaque tables, cached", () => {
    expect(COLORMAPS).toEqual(["viridis", "magma", "inferno", "plasma", "gray", "coolwarm", "RdBu"]);
    for (const name of COLORMAPS) {
      const t = lut(name);
      expect(t.length).toBe(1024);
      for (let i = 3; i < 1024; i += 4) expect(t[i]).toBe(255);
      expect(lut(name)).toBe(t);
    }
  });

  it("matches matplotlib within 2 RGB units", () => {
    for (const [name, entries] of Object.entries(REF)) {
      const t = lut(name);
      for (const [i, rgb] of Object.entries(entries)) {
        const k = Number(i) * 4;
        for (let c = 0; c < 3; c++) {
          expect(Math.abs(t[k + c] - rgb[c]), `${name}[${i}][${c}]`).toBeLessThanOrEqual(2);
        }
      }
    }
  });

  it("has the viridis endpoints #440154 and #fde725", () => {
    expect(colorAt("viridis", 0)).toEqual([0x44, 0x01, 0x54]);
    expect(colorAt("viridis", 1)).toEqual([0xfd, 0xe7, 0x25]);
    expect(cssColor("viridis", 1)).toBe("rgb(253, 231, 37)");
    // clamping and NaN
    expect(colorAt("viridis", 7)).toEqual([0xfd, 0xe7, 0x25]);
    expect(colorAt("viridis", -1)).toEqual([0x44, 0x01, 0x54]);
    expect(colorAt("viridis", NaN)).toEqual([0x44, 0x01, 0x54]);
  });

  it("falls back to viridis for unknown names", () => {
    expect(lut("no-such-map")).toBe(lut("viridis"));
  });

  it("sequential maps get lighter (monotone up to small wiggles)", () => {
    for (const name of ["viridis", "magma", "inferno", "plasma", "gray"]) {
      let prev = -Infinity;
      for (let i = 0; i <= 255; i += 8) {
        const l = light(colorAt(name, i / 255));
        expect(l, `${name} at ${i}`).toBeGreaterThan(prev - 1.5);
        prev = l;
      }
      expect(light(colorAt(name, 1))).toBeGreaterThan(light(colorAt(name, 0)) + 150);
    }
  });

  it("diverging maps are light in the middle and dark at both ends", () => {
    for (const name of ["coolwarm", "RdBu"]) {
      const mid = light(colorAt(name, 0.5));
      expect(mid).toBeGreaterThan(light(colorAt(name, 0)) + 60);
      expect(mid).toBeGreaterThan(light(colorAt(name, 1)) + 60);
    }
  });

  it("applies the table to uint8 pixels and paints through ImageData", () => {
    const src = new Uint8Array([0, 255, 128, 0]);
    const px = applyLut(src, "gray", 0.5);
    expect(Array.from(px)).toEqual([0, 0, 0, 128, 255, 255, 255, 128, 128, 128, 128, 128, 0, 0, 0, 128]);
    let put: { data: Uint8ClampedArray; width: number; height: number } | null = null;
    const ctx = {
      createImageData: (w: number, h: number) => ({ data: new Uint8ClampedArray(w * h * 4), width: w, height: h }),
      putImageData: (img: any, x: number, y: number) => {
        expect([x, y]).toEqual([0, 0]);
        put = img;
      },
    } as unknown as CanvasRenderingContext2D;
    paintU8(src, 2, 2, "viridis", ctx);
    expect(put).not.toBeNull();
    expect(Array.from(put!.data.slice(0, 8))).toEqual([0x44, 0x01, 0x54, 255, 0xfd, 0xe7, 0x25, 255]);
    expect(() => paintU8(src, 3, 2, "viridis", ctx)).toThrow(/needs 6 values/);
  });
});
