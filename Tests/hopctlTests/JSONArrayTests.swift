import Foundation
import Testing

@testable import HopctlCommands

/// `hopctl history --all-runs --json` prints its array one run at a time (`Output.JSONArray`): the
/// text must be exactly what printing the whole array at once gave, whatever the elements hold.
@Suite struct JSONArrayTests {
    struct Element: Encodable {
        var name: String
        var list: [Int]
        var nested: [String: [String]]
        var optional: String?
    }

    static let elements = [
        Element(name: "a", list: [], nested: [:], optional: nil),
        Element(name: "line\nbreak \"quoted\" / slash", list: [1, 2], nested: ["k": [], "j": ["x"]], optional: "o"),
        Element(name: "", list: [3], nested: ["deep": ["1", "2"]], optional: nil),
    ]

    @Test(arguments: 0...3) func anArrayWrittenAnElementAtATimeIsTheArrayWrittenAtOnce(count: Int) throws {
        let elements = Array(Self.elements.prefix(count))
        var text = ""
        var array = Output.JSONArray { text += $0 }
        for element in elements { try array.append(element) }
        array.finish()
        #expect(text == (try Output.jsonText(elements)) + "\n", "\(text)")
    }

    @Test func aLongArrayIsWrittenAsItGoesNotAtTheEnd() throws {
        var writes: [Int] = []
        var array = Output.JSONArray { writes.append($0.utf8.count) }
        for index in 0..<5_000 {
            try array.append(Element(name: "element \(index)", list: [index], nested: [:], optional: nil))
        }
        let beforeTheEnd = writes.count
        array.finish()
        #expect(beforeTheEnd > 5, "\(beforeTheEnd) writes before the end")
        #expect(writes.dropLast().allSatisfy { $0 < 1 << 17 }, "\(writes.max() ?? 0) bytes in one write")
    }
}
