// Colormap lookup tables (256 RGBA entries) for the views.
// Control points are taken from matplotlib's 256-entry tables (viridis, magma, inferno, plasma from
// its _cm_listed data; coolwarm sampled from its segment data; RdBu from the 11 ColorBrewer colours
// matplotlib uses) at evenly spaced positions and linearly interpolated: every entry is within
// 2 RGB units of matplotlib's (checked against matplotlib 3.11 when the table was generated).

export type ColormapName = "viridis" | "magma" | "inferno" | "plasma" | "gray" | "coolwarm" | "RdBu";

/** Names accepted by `lut`/`colorAt`/`paintU8` (a plain string list, e.g. for a <select>). */
export const COLORMAPS: string[] = ["viridis", "magma", "inferno", "plasma", "gray", "coolwarm", "RdBu"];

/** Evenly spaced control points, "rrggbb" hex concatenated, first = t 0, last = t 1. */
const CONTROL: Record<ColormapName, string> = {
  viridis:
    "44015446085c471063481769481d6f482475472a7a46307e453781433d844142873f48893d4e8a3a538b38598c355e8d" +
    "33638d31688e2e6d8e2c718e2a768e297b8e27808e25848e23898e218e8d20928c1f978b1e9c891fa18821a58524aa83" +
    "28ae802eb37c35b7793dbc7446c06f50c46a5ac86465cb5e70cf577cd25089d54895d840a2da37b0dd2fbddf26cae11f" +
    "d8e219e5e419f1e51dfde725",
  magma:
    "00000402020b0504160907200e0b2b140e361a104221114e29115a311165390f6e420f754a107952137c5a167e621980" +
    "6a1c81721f81792282812581892881912b81992d80a1307eaa337db2357bba3878c23b75ca3e72d2426fd9466be04c67" +
    "e75263ec5860f1605df4695cf7725cf97b5dfb8560fc8e64fd9869fea16efeaa74feb47bfebd82fec68afecf92fed89a" +
    "fde2a3fdebacfcf4b6fcfdbf",
  inferno:
    "00000402020c0504170a072210092d160b391e0c45260c512f0a5b380962400a67490b6a510e6c59106e61136e69166e" +
    "71196e781c6d801f6c88226a902568982766a02a63a82e5fb0315bb73557bf3952c63d4dcc4248d34743d94d3ddf5337" +
    "e45a31e9612bed6925f1711ff47918f78212f98b0bfa9407fb9d07fca60cfcb014fbba1ffac42af8cd37f6d746f4e156" +
    "f2ea69f2f27df5f992fcffa4",
  plasma:
    "0d08871b068d2605912f059638049a41049d4903a05102a35901a56100a76900a87100a87801a88004a88707a68e0ca4" +
    "9511a19c179ea21d9aa82296ae2892b42e8dba3388bf3984c43e7fc9447acd4a76d24f71d6556dda5b69de6164e26660" +
    "e66c5ce97257ed7953f07f4ff3854bf58c46f79342f99a3efba139fca835fdaf31feb72dfebe2afdc627fcce25fbd724" +
    "f8df25f6e826f3f027f0f921",
  gray: "000000ffffff",
  coolwarm:
    "3b4cc04055c8465ecf4c66d6536edd5977e35f7fe86687ed6c8ff17396f57a9df881a4fb88abfd8fb1fe96b7ff9dbdff" +
    "a3c2feaac7fdb1cbfcb7cff9bed2f6c4d5f3cad8efcfdaead5dbe5dadce0dfdbd9e4d9d2e9d5cbedd2c3f0cdbbf2c9b4" +
    "f5c4acf6bea4f7b89cf7b194f7aa8cf6a385f59c7df39475f08b6eed8366e97a5fe57058e16751dc5d4ad65244d0473d" +
    "ca3b37c32e31bb1b2cb40426",
  RdBu: "67001fb2182bd6604df4a582fddbc7f7f7f7d1e5f092c5de4393c32166ac053061",
};

const cache = new Map<string, Uint8ClampedArray>();

function build(hex: string): Uint8ClampedArray {
  const n = hex.length / 6;
  const pts: number[][] = [];
  for (let i = 0; i < n; i++) {
    const s = hex.slice(i * 6, i * 6 + 6);
    pts.push([parseInt(s.slice(0, 2), 16), parseInt(s.slice(2, 4), 16), parseInt(s.slice(4, 6), 16)]);
  }
  const out = new Uint8ClampedArray(256 * 4);
  for (let i = 0; i < 256; i++) {
    const pos = (i / 255) * (n - 1);
    const k = Math.min(Math.floor(pos), n - 2);
    const f = pos - k;
    for (let c = 0; c < 3; c++) out[i * 4 + c] = Math.round(pts[k][c] * (1 - f) + pts[k + 1][c] * f);
    out[i * 4 + 3] = 255;
  }
  return out;
}

/** Whether `name` is a known colormap. */
export function isColormap(name: string): name is ColormapName {
  return COLORMAPS.includes(name);
}

/** 256×RGBA lookup table of colormap `name` (cached; unknown names fall back to viridis). */
export function lut(name: string): Uint8ClampedArray {
  const key: ColormapName = isColormap(name) ? name : "viridis";
  let table = cache.get(key);
  if (!table) {
    table = build(CONTROL[key]);
    cache.set(key, table);
  }
  return table;
}

/** RGB colour of `name` at t in [0, 1] (clamped; NaN gives the t = 0 colour). */
export function colorAt(name: string, t: number): [number, number, number] {
  const table = lut(name);
  const x = Number.isFinite(t) ? Math.min(1, Math.max(0, t)) : t === Infinity ? 1 : 0;
  const i = Math.round(x * 255) * 4;
  return [table[i], table[i + 1], table[i + 2]];
}

/** CSS colour string (`rgb(r, g, b)`) of `name` at t in [0, 1]. */
export function cssColor(name: string, t: number): string {
  const [r, g, b] = colorAt(name, t);
  return `rgb(${r}, ${g}, ${b})`;
}

/** Map a uint8 image (row-major, width × height) through a colormap into RGBA pixels. */
export function applyLut(
  src: Uint8Array | Uint8ClampedArray,
  name: string,
  alpha = 1,
  out?: Uint8ClampedArray,
): Uint8ClampedArray {
  const table = lut(name);
  const rgba = out ?? new Uint8ClampedArray(src.length * 4);
  const a = Math.round(Math.min(1, Math.max(0, alpha)) * 255);
  for (let i = 0, j = 0; i < src.length; i++, j += 4) {
    const k = src[i] * 4;
    rgba[j] = table[k];
    rgba[j + 1] = table[k + 1];
    rgba[j + 2] = table[k + 2];
    rgba[j + 3] = a;
  }
  return rgba;
}

/**
 * Draw a uint8 image (width × height, row-major) through colormap `name` onto `ctx` at (0, 0),
 * one canvas pixel per value (scale the canvas with CSS, `image-rendering: pixelated`).
 */
export function paintU8(
  src: Uint8Array | Uint8ClampedArray,
  width: number,
  height: number,
  name: string,
  ctx: CanvasRenderingContext2D,
  alpha = 1,
): void {
  if (src.length !== width * height) {
    throw new Error(`nbdebug: image of ${width}×${height} needs ${width * height} values, got ${src.length}`);
  }
  const image = ctx.createImageData(width, height);
  applyLut(src, name, alpha, image.data);
  ctx.putImageData(image, 0, 0);
}
