/// Random secrets: hop tokens and generated session tokens.
public enum Token {
    private static let digits: [UInt8] = Array("0123456789abcdef".utf8)

    /// `byteCount` random bytes from the system's generator, as lowercase hex.
    public static func random(byteCount: Int = 16) -> String {
        var generator = SystemRandomNumberGenerator()
        let count = max(0, byteCount)
        return String(unsafeUninitializedCapacity: count * 2) { buffer in
            var word: UInt64 = 0
            for index in 0..<count {
                if index % 8 == 0 { word = generator.next() }  // one system call per 8 bytes
                let byte = UInt8(truncatingIfNeeded: word)
                word >>= 8
                buffer[2 * index] = digits[Int(byte >> 4)]
                buffer[2 * index + 1] = digits[Int(byte & 0xf)]
            }
            return count * 2
        }
    }
}
