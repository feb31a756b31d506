/// Random secrets: hop tokens and generated session tokens.
public enum Token {
    /// `byteCount` random bytes from the system's generator, as lowercase hex.
    public static func random(byteCount: Int = 16) -> String {
        var generator = SystemRandomNumberGenerator()
        let digits = Array("0123456789abcdef")
        var text = ""
        text.reserveCapacity(byteCount * 2)
        for _ in 0..<byteCount {
            let byte = UInt8.random(in: .min ... .max, using: &generator)
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0xf)])
        }
        return text
    }
}
